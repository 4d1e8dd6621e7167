"""Comparison across jobs: quality ± 95% CI and cost per job, quality against cost, the training
curves overlaid, the spec fields that differ (reports.story), and the paper's Figure 1 (one group
of bars per objective, one bar per variant: offline, offline+humanline, online,
online+humanline; ± 1 SE), a table, and z-tests of the paper's two claims per objective
(offline+humanline vs offline, and vs online) with Holm-Bonferroni adjusted p-values.

Input: [{"job": {"id", "objective", "variant", ...}, "evaluations": [summaries]}]; each job
contributes its newest succeeded evaluation reporting `metric` (the final model preferred over
intermediate checkpoints; `file_id` restricts to evaluations on one eval file); "spec",
"metrics" and "started" feed the cost, curves and differences (see reports.story). When no job
has the metric the page says so and falls back to the jobs' training metrics.
"""

from __future__ import annotations

import math
from typing import Any

from reports import plots, story
from reports.groups import build_groups, render_groups
from reports.html import card, esc, fmt, page, table
from reports.stats import Estimate, holm_bonferroni, metric_estimate, pick_evaluation, z_test

VARIANTS = ("offline", "offline+humanline", "online", "online+humanline")
OBJECTIVES = ("sft", "dpo", "kto", "grpo")
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


def build_comparison(
    entries: list[dict[str, Any]],
    metric: str = "lc_win_rate",
    file_id: str | None = None,
    group_by: str | None = None,
) -> dict[str, Any]:
    """`group_by`: a metadata key; its groups' curves with SE bands (reports.groups)."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; one of {', '.join(METRICS)}")
    rows, warnings = [], []
    for entry in entries:
        job = entry["job"]
        ev = pick_evaluation(entry.get("evaluations") or [], metric, file_id)
        est = metric_estimate(ev, metric) if ev else None
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
                "ci95": 1.96 * est.se if est and math.isfinite(est.se) else None,
                "cost": story.cost(entry),
                "training": story.final_training(entry),
                "code_version": (job.get("result") or {}).get("code_version"),
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
    for t, adj in zip(tests, holm_bonferroni([t["p_value"] for t in tests]), strict=True):
        t["p_holm"] = adj
    fallback = None
    if rows and all(r["value"] is None for r in rows):
        fallback = (
            f"No job has a succeeded evaluation reporting {METRICS[metric][0]} ({metric})"
            + (f" on {file_id}" if file_id else "")
            + ": showing the jobs' training metrics instead. Evaluate them "
            "(POST /v1/evaluations) to compare quality."
        )
        warnings = [w for w in warnings if "has no succeeded evaluation" not in w]
    return {
        "object": "comparison",
        "metric": metric,
        "file_id": file_id,
        "rows": rows,
        "tests": tests,
        "warnings": warnings,
        "fallback": fallback,
        "curves": story.curves(entries),
        "spec_differences": story.spec_differences(entries),
        "groups": (
            {"key": group_by, "groups": build_groups(entries, group_by, metric, file_id)}
            if group_by
            else None
        ),
    }


def _best(rows: list[dict[str, Any]], objective: str, variant: str) -> dict[str, Any] | None:
    cands = [
        r
        for r in rows
        if r["objective"] == objective and r["variant"] == variant and r["value"] is not None
    ]
    return cands[-1] if cands else None


def _figure1(rows: list[dict[str, Any]], label: str, percent: bool) -> str:
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
    if not (objectives and series):
        return ""
    return plots.grouped_bars(
        objectives,
        series,
        title=f"{label} by objective and variant (± 1 SE)",
        ylabel=label + (" (%)" if percent else ""),
        percent=percent,
    )


# cost axis of the quality-vs-cost chart: the first measure every evaluated job has
COST_AXES = (
    ("sampled_completions", "completions sampled"),
    ("sampled_tokens", "tokens sampled"),
    ("trained_tokens", "tokens trained"),
    ("gpu_hours", "GPU-hours"),
    ("wall_clock_s", "wall-clock (s)"),
)


def _quality_vs_cost(rows: list[dict[str, Any]], label: str, percent: bool) -> str:
    rated = [r for r in rows if r["value"] is not None]
    for key, axis in COST_AXES:
        if rated and all(r["cost"][key] is not None for r in rated):
            points = [
                (
                    str(r["job_id"]),
                    float(r["cost"][key]),
                    float(r["value"]),
                    r["ci95"],
                    plots.VARIANT_COLORS.get(r["variant"] or "", "#4c78a8"),
                )
                for r in rated
            ]
            return plots.scatter(
                points,
                title=f"{label} against cost (± 95% CI)",
                xlabel=axis,
                ylabel=label + (" (%)" if percent else ""),
                percent=percent,
            )
    return ""


def _curves_section(curves: dict[str, dict[str, tuple[list, list]]]) -> str:
    figs = []
    for name, by_job in curves.items():
        svg = plots.line_panel(
            story.CURVE_LABELS.get(name, name), by_job, ylabel=story.CURVE_LABELS.get(name, name)
        )
        if svg:
            figs.append(f"<div>{svg}</div>")
    if not figs:
        return (
            '<h2>Training curves</h2><p class="muted">No training metrics logged by these jobs.</p>'
        )
    return f'<h2>Training curves</h2><div class="grid">{"".join(figs)}</div>'


def _cost_cells(c: dict[str, Any]) -> list[str]:
    approx = "≈" if c["trained_tokens_approx"] and c["trained_tokens"] is not None else ""
    return [
        "–" if c["wall_clock_s"] is None else f"{c['wall_clock_s']:.0f} s",
        approx + fmt(None if c["trained_tokens"] is None else int(c["trained_tokens"])),
        fmt(None if c["sampled_completions"] is None else int(c["sampled_completions"])),
        fmt(None if c["sampled_tokens"] is None else int(c["sampled_tokens"])),
        fmt(c["gpu_hours"], 3)
        if c["gpu_hours"] is not None
        else ("–" if c["gpus"] else "CPU / not recorded"),
    ]


def render_comparison_html(doc: dict[str, Any]) -> str:
    metric = doc["metric"]
    label, percent = METRICS[metric]
    rows = [{**r, "objective": r["objective"] or "unknown"} for r in doc["rows"]]
    k = 100 if percent else 1

    def show(r: dict[str, Any]) -> str:
        if r["value"] is None:
            return "–"
        ci = f" ± {k * r['ci95']:.1f}" if r.get("ci95") is not None else ""
        return f"{k * r['value']:.1f}{'%' if percent else ''}{ci}"

    quality_rows = [
        (
            r["job_id"],
            r["objective"],
            r["variant"],
            show(r),
            r["evaluation_id"] or "–",
            "final" if r["step"] is None and r["evaluation_id"] else fmt(r["step"]),
            r["file_id"] or "–",
            *_cost_cells(r["cost"]),
        )
        for r in rows
    ]
    test_rows = [
        (
            t["objective"],
            f"{t['a']} − {t['b']}",
            f"{k * t['difference']:+.2f}",
            fmt(t["p_value"], 3),
            fmt(t["p_holm"], 3),
        )
        for t in doc["tests"]
    ]
    warnings = "".join(f'<div class="warn">{esc(w)}</div>' for w in doc["warnings"])
    if doc.get("fallback"):
        warnings = f'<div class="warn" id="fallback">{esc(doc["fallback"])}</div>' + warnings
    figs = [
        f for f in (_figure1(rows, label, percent), _quality_vs_cost(rows, label, percent)) if f
    ]
    train_rows = [
        (
            r["job_id"],
            *(fmt(r["training"].get(n)) for n in story.FINAL),
            r.get("code_version") or "not recorded",
        )
        for r in rows
    ]
    diffs = doc.get("spec_differences") or []
    body = (
        f'<div class="cards">{card("metric", label)}{card("jobs", str(len(rows)))}</div>{warnings}'
        + (
            f'<div class="grid">{"".join(f"<figure>{f}</figure>" for f in figs)}</div>'
            if figs
            else ""
        )
        + render_groups(doc, label, percent)
        + "<h2>Jobs: quality and cost</h2>"
        + table(
            [
                "job",
                "objective",
                "variant",
                f"{label} (± 95% CI)",
                "evaluation",
                "checkpoint",
                "file",
                "wall-clock",
                "tokens trained",
                "completions sampled",
                "tokens sampled",
                "GPU-hours",
            ],
            quality_rows,
            numeric=[3, 7, 8, 9, 10, 11],
        )
        + '<p class="muted small">Cost: '
        + esc(story.__doc__.split("Cost: ")[1].strip())
        + "</p>"
        + _curves_section(doc.get("curves") or {})
        + "<h3>Last logged training metrics</h3>"
        + table(
            ["job", *story.FINAL, "code version"],
            train_rows,
            numeric=list(range(1, len(story.FINAL) + 1)),
        )
        + "<h2>Spec differences</h2>"
        + (
            table(
                ["field", *(str(r["job_id"]) for r in rows)], [(f, *map(fmt, v)) for f, v in diffs]
            )
            if diffs
            else '<p class="muted">The jobs\' specs do not differ (beyond their data files).</p>'
        )
        + '<h2>Tests</h2><p class="muted small">Two-sided z-tests on the difference, '
        "Holm-Bonferroni adjusted across the table (as the paper does).</p>"
        + (
            table(["objective", "difference", "Δ", "p", "p (Holm)"], test_rows, numeric=[2, 3, 4])
            if test_rows
            else '<p class="muted">No pairs of variants to test.</p>'
        )
    )
    return page("Comparison across jobs", body, esc(f"{label} · {len(rows)} jobs"))
