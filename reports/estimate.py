"""A job report's "Estimate vs actual" (issue 27 item 4): the cost predicted when the job was
created (in its `created` event, contract.estimate) beside what the run measured.

Actual figures: steps (the job's current step, else the last logged one), tokens (the
trainer's per-step tokens_per_s × step_time), wall-clock (the setup, training and finalize
phases: what the estimate predicts; queueing is not part of it) and its training phase, the
micro-batch and memory estimate the trainer chose with (its `started` event). The peak memory
is not recorded by the trainer: shown as such, never invented."""

from __future__ import annotations

from typing import Any

from reports.html import esc, fmt, table

RUN_PHASES = ("setup", "training", "finalize")


def _event_data(events: list[dict[str, Any]], kind: str, last: bool = False) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        d for e in events if e.get("kind") == kind and isinstance(d := e.get("data"), dict)
    ]
    return (found[-1] if last else found[0]) if found else {}


def measured_tokens(metrics: list[dict[str, Any]], steps: Any) -> int | None:
    """Tokens through the model, from the trainer's per-step `tokens_per_s` × `step_time`
    (every process's tokens): the logged steps' sum, scaled to `steps` when not every step
    was logged. None when the metrics do not say."""
    per_step = [
        float(m["tokens_per_s"]) * float(m["step_time"])
        for m in metrics
        if isinstance(m.get("tokens_per_s"), int | float)
        and isinstance(m.get("step_time"), int | float)
    ]
    if not per_step:
        return None
    total = sum(per_step)
    if isinstance(steps, int) and steps > len(per_step):
        total *= steps / len(per_step)
    return round(total)


def estimate_vs_actual(
    events: list[dict[str, Any]],
    job: dict[str, Any],
    timing: dict[str, Any],
    metrics: list[dict[str, Any]],
) -> dict[str, Any] | None:
    """{"estimate": the stored estimate, "rows": [{figure, predicted, actual, ratio}]}; None
    for a job created without one."""
    est = _event_data(events, "created").get("estimate")
    if not est:
        return None
    seconds = {p["phase"]: p["seconds"] for p in timing.get("phases", [])}
    ran = [seconds[p] for p in RUN_PHASES if p in seconds]
    started = _event_data(events, "started", last=True)
    last_step = max((int(m["step"]) for m in metrics if "step" in m), default=None)
    steps = job.get("current_step") or last_step

    def row(figure: str, predicted: Any, actual: Any, unit: str = "") -> dict[str, Any]:
        ratio = (
            round(predicted / actual, 3)
            if isinstance(predicted, int | float) and isinstance(actual, int | float) and actual
            else None
        )
        return {"figure": figure, "predicted": predicted, "actual": actual, "ratio": ratio,
                "unit": unit}  # fmt: skip

    rows = [
        row("optimizer steps", est.get("steps"), steps),
        row("training tokens", est.get("tokens"), measured_tokens(metrics, steps)),
        row(
            "wall-clock (setup to end)",
            est.get("wall_clock_seconds"),
            round(sum(ran), 3) if ran else None,
            "s",
        ),  # fmt: skip
        row("training phase", est.get("train_seconds"), seconds.get("training"), "s"),
        row("micro-batch", est.get("micro_batch"), started.get("micro_batch")),
        row("grad_accum", est.get("grad_accum"), started.get("grad_accum")),
        row(
            "memory per process",
            est.get("memory_gib_per_process"),
            started.get("memory_estimate_gib"),
            "GiB",
        ),  # fmt: skip
        row("peak memory", est.get("memory_gib_per_process"), None, "GiB"),
    ]
    return {"estimate": est, "rows": rows}


def estimate_section(section: dict[str, Any] | None) -> str:
    """The HTML section (empty for a job without an estimate)."""
    if not section:
        return ""
    est = section["estimate"]
    rows = [
        (
            r["figure"],
            f"{fmt(r['predicted'])} {r['unit']}".strip(),
            "not recorded" if r["actual"] is None else f"{fmt(r['actual'])} {r['unit']}".strip(),
            "–" if r["ratio"] is None else f"{r['ratio']:.2f}",
        )
        for r in section["rows"]
    ]
    where = f"{est.get('processes', 1)} × {est.get('device', '?')}"
    return (
        "<h2>Estimate vs actual</h2>"
        f'<p class="muted small">Predicted at creation for {esc(where)} '
        f"({esc(est.get('gpu_hours', 0))} GPU-hours); tokens "
        f"{esc(est.get('tokens_method', ''))}. Memory per process: the estimate the trainer "
        "chose with; no measured peak is recorded.</p>"
        + table(["figure", "predicted", "actual", "predicted ÷ actual"], rows, numeric=[1, 2, 3])
    )
