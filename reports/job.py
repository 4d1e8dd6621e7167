"""A job's report: JSON (`build_job_report`) and a self-contained HTML page (`render_job_html`).

Inputs are plain data, so the same code serves the API (rows of the DB) and a standalone run
directory (`load_run_dir`: metrics.jsonl, events.jsonl, data_quality.json, result.json and the
checkpoint's spec.json):

    job           {"id", "status", "objective", "variant", "base_model", "created_at",
                   "started_at", "finished_at", "result", "error", "metadata"}   (all optional)
    spec          the job spec (dict)
    metrics       [{"step": n, "loss": ..., ...}]               one per logged step
    events        [{"kind", "message", "data", "time"}]         time: epoch s, datetime or ISO
    data_quality  data_quality.json (or None)
    evaluations   [evaluation summaries: "id", "kind", "status", "step", "file_id",
                   "metrics", "judge", "created_at", ...]
    training_file {"id", "sha256", "filename", "format", "records"} (or None)
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reports import plots
from reports.estimate import estimate_section, estimate_vs_actual
from reports.html import card, esc, fmt, page, pct, pre_json, table
from reports.panels import flat_zero_warnings, humanline_of, objective_of, panels_for
from reports.rounds import round_rows, round_warnings, rounds_section
from reports.rundir import read_run_dir
from reports.times import to_epoch
from reports.version import code_version

TERMINAL = ("succeeded", "failed", "cancelled")
HEADLINE = {"instruction": "lc_win_rate", "math": "pass_at_1"}


def _iso(value: Any) -> str | None:
    t = to_epoch(value)
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds") if t is not None else None


def phases(events: list[dict[str, Any]], start: Any = None, end: Any = None) -> dict[str, Any]:
    """Wall-clock per phase from the event history: queued (waiting for a worker), setup
    (model, data and the data-quality pass), training, finalize (export and uploads). A job
    that was requeued spends time in a phase more than once; the times add up."""
    timed = sorted(  # stable: events of the same instant keep their (seq) order
        ((t, e) for e in events if (t := to_epoch(e.get("time"))) is not None),
        key=lambda te: te[0],
    )
    t0 = to_epoch(start)
    has_status = any(e.get("kind") == "status" for _, e in timed)
    current: str | None = "queued" if has_status else "setup"
    if t0 is None:
        t0 = timed[0][0] if timed else None
    seconds: dict[str, float] = defaultdict(float)
    last = t0
    for t, e in timed:
        kind, data = e.get("kind"), e.get("data") or {}
        new: str | None = current
        if kind == "status":
            to = data.get("to")
            new = {"queued": "queued", "running": "setup"}.get(
                str(to), None if to in TERMINAL else current
            )
        elif kind in ("started", "resumed"):
            new = "training"
        elif kind in ("finished", "stopped"):
            new = "finalize"
        if new != current:
            if current is not None and last is not None:
                seconds[current] += max(0.0, t - last)
            current, last = new, t
    t_end = to_epoch(end)
    if current is not None and last is not None and t_end is not None and t_end > last:
        seconds[current] += t_end - last
    order = ["queued", "setup", "training", "finalize"]
    rows = [{"phase": p, "seconds": round(seconds[p], 3)} for p in order if p in seconds]
    return {"phases": rows, "total_seconds": round(sum(seconds.values()), 3)}


def metric_series(metrics: list[dict[str, Any]]) -> dict[str, dict[str, list]]:
    series: dict[str, dict[str, list]] = {}
    for m in sorted(metrics, key=lambda m: m.get("step", 0)):
        for k, v in m.items():
            if k in ("step", "time") or not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            s = series.setdefault(k, {"steps": [], "values": []})
            s["steps"].append(int(m["step"]))
            s["values"].append(float(v) if math.isfinite(float(v)) else None)
    return series


def _code_version_of(job: dict[str, Any], events: list[dict[str, Any]]) -> str | None:
    result = job.get("result") or {}
    if result.get("code_version"):
        return str(result["code_version"])
    for e in events:
        v = (e.get("data") or {}).get("code_version")
        if v:
            return str(v)
    return None


def build_job_report(
    *,
    job: dict[str, Any],
    spec: dict[str, Any] | None,
    metrics: list[dict[str, Any]],
    events: list[dict[str, Any]],
    data_quality: dict[str, Any] | None = None,
    evaluations: list[dict[str, Any]] | None = None,
    training_file: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec = spec or {}
    series = metric_series(metrics)
    end = job.get("finished_at")
    if end is None and job.get("status") not in TERMINAL:
        end = datetime.now(UTC)  # a live job: its current phase runs until now
    timing = phases(events, job.get("created_at"), end)
    # The data-quality warning has its own place on the page (next to the histogram).
    dq_warning = (data_quality or {}).get("warning")
    warnings = [e.get("message") for e in events if e.get("kind") == "warning"]
    warnings = [w for w in warnings if w and w != dq_warning]
    objective = objective_of(spec, job)
    rounds = round_rows(events, metrics, objective)
    warnings += flat_zero_warnings(series) + round_warnings(rounds)
    return {
        "object": "report",
        "job": {
            k: (_iso(job.get(k)) if k.endswith("_at") else job.get(k))
            for k in (
                "id",
                "status",
                "objective",
                "variant",
                "base_model",
                "created_at",
                "started_at",
                "finished_at",
                "error",
                "metadata",
            )
            if k in job
        },
        "manifest": {
            "spec": spec,
            "seed": spec.get("seed"),
            "training_file": training_file,
            "code_version": _code_version_of(job, events),
            "report_generated_by": code_version(),
            "report_generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "wall_clock": timing,
            "result": job.get("result"),
        },
        "training": {
            "steps_logged": len(metrics),
            "last_step": max((int(m["step"]) for m in metrics), default=None),
            "final": {k: s["values"][-1] for k, s in series.items() if s["values"]},
            "series": series,
        },
        "objective": objective,
        "estimate": estimate_vs_actual(events, job, timing, metrics),
        "humanline": humanline_of(spec, job),
        "rounds": rounds,
        "data_quality": data_quality,
        "evaluations": evaluations or [],
        "warnings": [w for w in dict.fromkeys(warnings) if w],
    }


# --- HTML ---------------------------------------------------------------------------------------


def _training_section(report: dict[str, Any]) -> str:
    series = report["training"]["series"]
    if not series:
        return '<h2>Training curves</h2><p class="muted">No metrics logged yet.</p>'
    figs = []
    for panel, present in panels_for(series, report.get("objective"), report.get("humanline")):
        svg = plots.line_panel(panel.title, present, ylabel=panel.ylabel, logy=panel.logy)
        figs.append(f"<div>{svg}</div>")
    final = report["training"]["final"]
    rows = [(k, fmt(v)) for k, v in sorted(final.items())]
    return (
        "<h2>Training curves</h2>"
        f'<div class="grid">{"".join(figs)}</div>'
        "<details><summary>Last logged values</summary>"
        f"{table(['metric', 'value'], rows, numeric=[1])}</details>"
    )


def _quality_section(dq: dict[str, Any] | None) -> str:
    if not dq or not dq.get("n"):
        return (
            '<h2>Data quality</h2><p class="muted">No data-quality signal '
            "(quality_sample = 0, or the job has not scored its data yet).</p>"
        )
    hist = dq.get("histogram") or {}
    fig = ""
    if hist.get("counts") and hist.get("edges"):
        fig = plots.histogram(
            hist["counts"],
            hist["edges"],
            title=f"Mean token log-prob under π_ref at step 0 ({dq['n']} examples)",
            xlabel="mean token log-prob",
            marker=dq.get("low_quartile_top"),
            marker_label="paper's low-quartile top (−0.36)",
        )
    q = dq.get("quantiles") or {}
    rows = [(k, fmt(q.get(k))) for k in ("min", "q25", "median", "q75", "max") if k in q]
    rows.append(("mean", fmt(dq.get("mean"))))
    rows.append(
        (
            "at or below the low quartile",
            f"{100 * dq.get('fraction_at_or_below_low_quartile', 0):.1f}%",
        )
    )
    warn = f'<div class="warn">{esc(dq["warning"])}</div>' if dq.get("warning") else ""
    return (
        "<h2>Data quality</h2>"
        '<p class="muted small">The paper finds offline data helps a humanline run when its '
        "average token log-prob under the reference is high enough; its lowest quartile, "
        "[−1.03, −0.36], trained worse.</p>"
        f'{warn}<div class="grid">{f"<figure>{fig}</figure>" if fig else ""}'
        f"<div>{table(['statistic', 'value'], rows, numeric=[1])}</div></div>"
    )


def eval_headline(ev: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    name = HEADLINE.get(ev.get("kind", ""), "")
    return name, (ev.get("metrics") or {}).get(name)


def checkpoint_label(ev: dict[str, Any]) -> str:
    if ev.get("base_model") and not ev.get("job_id"):
        return f"base {ev['base_model']}"
    return "final" if ev.get("step") is None else f"step {ev['step']}"


def _evaluations_section(evals: list[dict[str, Any]]) -> str:
    if not evals:
        return (
            '<h2>Evaluations</h2><p class="muted">No evaluations of this job yet '
            "(POST /v1/evaluations).</p>"
        )
    rows = []
    for ev in evals:
        m = ev.get("metrics") or {}
        if ev.get("kind") == "instruction":
            main = (
                f"LC {pct(m.get('lc_win_rate'))} · raw {pct(m.get('win_rate'))} · "
                f"length {fmt(m.get('avg_length'))}"
            )
        elif ev.get("kind") == "math":
            main = f"pass@1 {pct(m.get('pass_at_1'))} · format {pct(m.get('format_rate'))}"
        else:
            main = ""
        err = (ev.get("error") or {}).get("message") if ev.get("status") == "failed" else ""
        rows.append(
            (
                ev.get("id"),
                ev.get("kind"),
                checkpoint_label(ev),
                ev.get("file_id"),
                ev.get("status"),
                main or err or "–",
                ev.get("judge") or "–",
            )
        )
    figs = []
    by_kind: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for ev in evals:
        if ev.get("status") == "succeeded":
            by_kind[(ev.get("kind", ""), ev.get("file_id") or "")].append(ev)
    for (kind, file_id), group in sorted(by_kind.items()):
        name, _ = eval_headline(group[0])
        if not name:
            continue
        group = sorted(
            group,
            key=lambda e: (e.get("step") is None, e.get("step") or 0, e.get("created_at") or ""),
        )
        labels = [checkpoint_label(e) for e in group]
        ests = [eval_headline(e)[1] or {} for e in group]
        svg = plots.bars(
            labels,
            [e.get("value", float("nan")) for e in ests],
            [e.get("se", float("nan")) for e in ests],
            title=f"{name} on {file_id or 'eval file'} (± 1 SE)",
            ylabel=f"{name} (%)",
            reference=0.5 if kind == "instruction" else None,
        )
        if svg:
            figs.append(f"<div>{svg}</div>")
    return (
        "<h2>Evaluations</h2>"
        + (f'<div class="grid">{"".join(figs)}</div>' if figs else "")
        + table(["evaluation", "kind", "checkpoint", "file", "status", "result", "judge"], rows)
    )


def _manifest_section(report: dict[str, Any]) -> str:
    man = report["manifest"]
    tf = man.get("training_file") or {}
    timing = man["wall_clock"]
    rows = [
        ("code version (job)", man.get("code_version") or "not recorded by the worker"),
        ("report generated by", man["report_generated_by"]),
        ("seed", man.get("seed")),
        ("training file", tf.get("id") or (man["spec"] or {}).get("training_file")),
        ("training data sha256", tf.get("sha256") or "–"),
        (
            "training data",
            f"{tf.get('format', '–')}, {fmt(tf.get('records'))} records, "
            f"{fmt(tf.get('bytes'))} bytes"
            if tf
            else "–",
        ),
        ("wall-clock total", f"{timing['total_seconds']:.1f} s"),
    ]
    phase_rows = [(p["phase"], f"{p['seconds']:.1f}") for p in timing["phases"]]
    return (
        "<h2>Manifest</h2>"
        + table(["", ""], rows)
        + "<h3>Wall-clock per phase</h3>"
        + table(["phase", "seconds"], phase_rows, numeric=[1])
        + "<h3>Job spec</h3>"
        + pre_json(man["spec"])
        + ("<h3>Result</h3>" + pre_json(man["result"]) if man.get("result") else "")
    )


def render_job_html(report: dict[str, Any]) -> str:
    job = report["job"]
    final = report["training"]["final"]
    cards = [
        card("status", str(job.get("status", "–"))),
        card("objective / variant", f"{job.get('objective', '–')} · {job.get('variant', '–')}"),
        card("last step", fmt(report["training"]["last_step"])),
    ]
    if "loss" in final:
        cards.append(card("last loss", fmt(final["loss"])))
    for ev in report["evaluations"]:
        name, est = eval_headline(ev)
        if est and ev.get("status") == "succeeded":
            cards.append(card(f"{name} ({checkpoint_label(ev)})", pct(est), ev.get("id", "")))
    warnings = "".join(f'<div class="warn">{esc(w)}</div>' for w in report["warnings"])
    err = job.get("error") or {}
    error = f'<div class="warn bad">{esc(err.get("message"))}</div>' if err.get("message") else ""
    body = (
        f'<div class="cards">{"".join(cards)}</div>{error}{warnings}'
        + _training_section(report)
        + rounds_section(report.get("rounds") or [], report.get("objective"))
        + _quality_section(report.get("data_quality"))
        + _evaluations_section(report["evaluations"])
        + estimate_section(report.get("estimate"))
        + _manifest_section(report)
    )
    subtitle = esc(
        f"{job.get('base_model', '')} · created {job.get('created_at') or '–'} · "
        f"finished {job.get('finished_at') or '–'}"
    )
    version = report["manifest"].get("code_version") or "not recorded by the worker"
    return page(f"Job {job.get('id', '')}", body, subtitle, code_version=version)


def load_run_dir(
    run_dir: str | Path, evaluations: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """build_job_report over a trainer run directory (`python -m trainer run` output, read by
    reports.rundir)."""
    return build_job_report(**read_run_dir(run_dir), evaluations=evaluations)


__all__ = ["build_job_report", "load_run_dir", "render_job_html"]
