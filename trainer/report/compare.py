"""Comparison across jobs: the paper's Figure 1 (one group of bars per objective, one bar per
variant: offline, offline+humanline, online, online+humanline; ± 1 SE), a table, and z-tests
of the paper's two claims per objective (offline+humanline vs offline, and vs online) with
Holm-Bonferroni adjusted p-values.

Input: [{"job": {"id", "objective", "variant", ...}, "evaluations": [summaries]}]; each job
contributes its newest succeeded evaluation reporting `metric` (the final model preferred over
intermediate checkpoints; `file_id` restricts to evaluations on one eval file).
"""

from __future__ import annotations

import math
from typing import Any

from trainer.evaluation.stats import Estimate, holm_bonferroni, z_test
from trainer.report import plots
from trainer.report.html import card, esc, fmt, page, table

VARIANTS = ("offline", "offline+humanline", "online", "online+humanline")
OBJECTIVES = ("dpo", "kto", "grpo")
# metric → (label, is a fraction shown in percent)
METRICS: dict[str, tuple[str, bool]] = {
    "lc_win_rate": ("length-controlled win rate", True),
    "win_rate": ("win rate", True),
    "avg_length": ("average length (chars)", False),
    "pass_at_1": ("pass@1", True),
    "pass_at_n": ("pass@n", True),
    "format_rate": ("format-reward rate", True),
    "boxed_rate": ("\\boxed{} rate", True),
}
CLAIMS = (("offline+humanline", "offline"), ("online", "offline+humanline"))


def _estimate(ev: dict[str, Any], metric: str) -> Estimate | None:
    value = (ev.get("metrics") or {}).get(metric)
    if isinstance(value, dict) and value.get("value") is not None:
        return Estimate(
            float(value["value"]), float(value.get("se") or 0.0), int(value.get("n") or 0)
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Estimate(
            float(value), float("nan"), int((ev.get("metrics") or {}).get("n_items") or 0)
        )
    return None


def pick_evaluation(
    evals: list[dict[str, Any]], metric: str, file_id: str | None = None
) -> dict[str, Any] | None:
    ok = [
        e
        for e in evals
        if e.get("status") == "succeeded"
        and _estimate(e, metric) is not None
        and (file_id is None or e.get("file_id") == file_id)
    ]
    if not ok:
        return None
    # final model first, then the latest step; newest evaluation breaks ties
    return max(
        ok,
        key=lambda e: (
            e.get("step") is None,
            e.get("step") or 0,
            str(e.get("created_at") or ""),
            e.get("id", ""),
        ),
    )


def build_comparison(
    entries: list[dict[str, Any]], metric: str = "lc_win_rate", file_id: str | None = None
) -> dict[str, Any]:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; one of {', '.join(METRICS)}")
    rows, warnings = [], []
    for entry in entries:
        job = entry["job"]
        ev = pick_evaluation(entry.get("evaluations") or [], metric, file_id)
        est = _estimate(ev, metric) if ev else None
        if ev is None:
            warnings.append(f"job {job.get('id')} has no succeeded evaluation reporting {metric}")
        rows.append(
            {
                "job_id": job.get("id"),
                "objective": job.get("objective"),
                "variant": job.get("variant"),
                "metadata": job.get("metadata") or {},
                "evaluation_id": ev.get("id") if ev else None,
                "file_id": ev.get("file_id") if ev else None,
                "step": ev.get("step") if ev else None,
                "value": est.value if est else None,
                "se": est.se if est and math.isfinite(est.se) else None,
                "n": est.n if est else None,
            }
        )
    files = {r["file_id"] for r in rows if r["file_id"]}
    if len(files) > 1:
        warnings.append(
            f"the jobs were evaluated on different files ({', '.join(sorted(files))}); "
            "pass file_id= to compare on one"
        )
    tests = []
    for objective in sorted({r["objective"] for r in rows if r["objective"]}):
        for a, b in CLAIMS:
            ra = _best(rows, objective, a)
            rb = _best(rows, objective, b)
            if ra and rb:
                p = z_test(
                    Estimate(ra["value"], ra["se"] or 0.0, ra["n"] or 0),
                    Estimate(rb["value"], rb["se"] or 0.0, rb["n"] or 0),
                )
                tests.append(
                    {
                        "objective": objective,
                        "a": a,
                        "b": b,
                        "job_a": ra["job_id"],
                        "job_b": rb["job_id"],
                        "difference": ra["value"] - rb["value"],
                        "p_value": p,
                    }
                )
    for t, adj in zip(tests, holm_bonferroni([t["p_value"] for t in tests])):
        t["p_holm"] = adj
    return {
        "object": "comparison",
        "metric": metric,
        "file_id": file_id,
        "rows": rows,
        "tests": tests,
        "warnings": warnings,
    }


def _best(rows: list[dict[str, Any]], objective: str, variant: str) -> dict[str, Any] | None:
    cands = [
        r
        for r in rows
        if r["objective"] == objective and r["variant"] == variant and r["value"] is not None
    ]
    return cands[-1] if cands else None


def render_comparison_html(doc: dict[str, Any]) -> str:
    metric = doc["metric"]
    label, percent = METRICS[metric]
    rows = [{**r, "objective": r["objective"] or "unknown"} for r in doc["rows"]]
    objectives = [o for o in OBJECTIVES if any(r["objective"] == o for r in rows)]
    objectives += sorted(
        {r["objective"] for r in rows if r["objective"] and r["objective"] not in objectives}
    )
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in rows)]
    # A cell with several jobs gets several bars: one series per (variant, k-th job).
    series = []
    for v in variants:
        depth = max(
            (sum(1 for r in rows if r["variant"] == v and r["objective"] == o) for o in objectives),
            default=0,
        )
        for k in range(depth):
            values, errors = [], []
            for o in objectives:
                cell = [r for r in rows if r["variant"] == v and r["objective"] == o]
                r = cell[k] if k < len(cell) else None
                values.append(r["value"] if r and r["value"] is not None else float("nan"))
                errors.append(r["se"] if r and r["se"] is not None else float("nan"))
            name = v if depth == 1 else f"{v} #{k + 1}"
            series.append((name, plots.VARIANT_COLORS.get(v, "#888888"), values, errors))
    fig = (
        plots.grouped_bars(
            objectives,
            series,
            title=f"{label} by objective and variant (± 1 SE)",
            ylabel=label + (" (%)" if percent else ""),
            percent=percent,
        )
        if objectives and series
        else ""
    )

    def show(r: dict[str, Any]) -> str:
        if r["value"] is None:
            return "–"
        k = 100 if percent else 1
        se = f" ± {k * r['se']:.1f}" if r["se"] is not None else ""
        return f"{k * r['value']:.1f}{'%' if percent else ''}{se}"

    table_rows = [
        (
            r["job_id"],
            r["objective"],
            r["variant"],
            show(r),
            r["evaluation_id"] or "–",
            "final" if r["step"] is None and r["evaluation_id"] else fmt(r["step"]),
            r["file_id"] or "–",
        )
        for r in rows
    ]
    test_rows = [
        (
            t["objective"],
            f"{t['a']} − {t['b']}",
            f"{(100 if percent else 1) * t['difference']:+.2f}",
            fmt(t["p_value"], 3),
            fmt(t["p_holm"], 3),
        )
        for t in doc["tests"]
    ]
    warnings = "".join(f'<div class="warn">{esc(w)}</div>' for w in doc["warnings"])
    body = (
        f'<div class="cards">{card("metric", label)}{card("jobs", str(len(rows)))}</div>{warnings}'
        f"<figure>{fig}</figure>"
        "<h2>Jobs</h2>"
        + table(
            ["job", "objective", "variant", label, "evaluation", "checkpoint", "file"],
            table_rows,
            numeric=[3],
        )
        + '<h2>Tests</h2><p class="muted small">Two-sided z-tests on the difference, Holm-Bonferroni '
        "adjusted across the table (as the paper does).</p>"
        + (
            table(["objective", "difference", "Δ", "p", "p (Holm)"], test_rows, numeric=[2, 3, 4])
            if test_rows
            else '<p class="muted">No pairs of variants to test.</p>'
        )
    )
    return page("Comparison across jobs", body, esc(f"{label} · {len(rows)} jobs"))
