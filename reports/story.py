"""What a comparison needs besides the evaluations: each job's cost, its training curves, its
final training metrics (the fallback when no job has the chosen evaluation metric), and the
spec fields that differ between the jobs.

An entry may carry, beside "job" and "evaluations":
    spec      the job spec                            → spec differences, log_every, num_samples
    metrics   [{"step", ...}] the logged steps       → curves, trained and sampled tokens
    started   the `started` event's data (optional)  → GPUs ("gpus" or "device" + "world_size")

Cost: wall-clock = finished_at − started_at (now for a running job); trained tokens = Σ
tokens_per_s × step_time over the logged steps (× log_every when steps are skipped, marked ≈);
sampled completions = Σ round/prompts × online.num_samples, sampled tokens = Σ
round/sampled_tokens where the trainer logs it; GPU-hours = wall-clock × GPUs where on GPU.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from reports.job import metric_series
from reports.stats import finite_number
from reports.times import to_epoch

CURVES = ("loss", "reward/mean", "rewards/margins", "rewards/accuracies", "kl", "grad_norm")
CURVE_LABELS = {
    "loss": "loss",
    "reward/mean": "mean reward (online rounds)",
    "rewards/margins": "reward margin",
    "rewards/accuracies": "pair accuracy",
    "kl": "KL (nats)",
    "grad_norm": "gradient norm",
}
FINAL = ("loss", "rewards/margins", "rewards/accuracies", "reward/mean", "kl")
IGNORED_SPEC_KEYS = ("training_file", "validation_file", "metadata", "suffix")


def _gpus(started: dict[str, Any]) -> int:
    if finite_number(started.get("gpus")):
        return int(started["gpus"])
    device = str(started.get("device") or "")
    if device.startswith("cuda"):
        return int(finite_number(started.get("world_size")) or 1)
    return 0


def cost(entry: dict[str, Any]) -> dict[str, Any]:
    job, spec = entry["job"], entry.get("spec") or {}
    metrics = entry.get("metrics") or []
    t0 = to_epoch(job.get("started_at"))
    t1 = to_epoch(job.get("finished_at"))
    if t1 is None and t0 is not None and job.get("status") in ("running", "validating"):
        t1 = datetime.now(UTC).timestamp()
    wall = t1 - t0 if t0 is not None and t1 is not None and t1 >= t0 else None
    every = int(spec.get("log_every") or 1)
    trained = [
        tps * st
        for m in metrics
        if (tps := finite_number(m.get("tokens_per_s"))) is not None
        and (st := finite_number(m.get("step_time")))
    ]
    rounds = [m for m in metrics if finite_number(m.get("round/index")) is not None]
    k = finite_number((spec.get("online") or {}).get("num_samples"))
    sampled_tok = [
        t for m in rounds if (t := finite_number(m.get("round/sampled_tokens"))) is not None
    ]
    gpus = _gpus(entry.get("started") or {})
    return {
        "wall_clock_s": wall,
        "trained_tokens": sum(trained) * every if trained else None,
        "trained_tokens_approx": every > 1,
        "sampled_completions": (
            sum(finite_number(m.get("round/prompts")) or 0 for m in rounds) * k
            if rounds and k
            else None
        ),
        "sampled_tokens": sum(sampled_tok) if sampled_tok else None,
        "rounds": len(rounds),
        "gpus": gpus,
        "gpu_hours": wall * gpus / 3600 if wall is not None and gpus else None,
    }


def curves(entries: list[dict[str, Any]]) -> dict[str, dict[str, tuple[list, list]]]:
    """metric → {job id: (steps, values)}, for the CURVES that at least one job logged."""
    out: dict[str, dict[str, tuple[list, list]]] = {}
    for entry in entries:
        series = metric_series(entry.get("metrics") or [])
        for name in CURVES:
            s = series.get(name)
            if s and any(v is not None for v in s["values"]):
                out.setdefault(name, {})[str(entry["job"].get("id"))] = (s["steps"], s["values"])
    return out


def final_training(entry: dict[str, Any]) -> dict[str, float | None]:
    series = metric_series(entry.get("metrics") or [])
    out: dict[str, float | None] = {}
    for name in FINAL:
        vals = [v for v in (series.get(name) or {}).get("values", []) if v is not None]
        out[name] = vals[-1] if vals else None
    return out


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj}


def spec_differences(entries: list[dict[str, Any]]) -> list[tuple[str, list[Any]]]:
    """(field, value per job) for every spec field whose values are not all the same."""
    if len(entries) < 2:
        return []
    flat = [
        {
            k: v
            for k, v in _flatten(e.get("spec") or {}).items()
            if k.split(".")[0] not in IGNORED_SPEC_KEYS
        }
        for e in entries
    ]
    keys = sorted(set().union(*flat))
    return [
        (k, [f.get(k, "–") for f in flat])
        for k in keys
        if len({repr(f.get(k, "–")) for f in flat}) > 1
    ]
