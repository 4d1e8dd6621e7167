"""Jobs grouped by a metadata key (the arms of a study, several seeds each): per group the
metric at each evaluated checkpoint as mean ± SE over the group's jobs, against optimizer
steps and against completions sampled by then, and the final value with the group's cost.

A job's points are its succeeded evaluations reporting the metric (on `file_id` when given):
an evaluation of a checkpoint at its step, the final model's at the job's last step (the
spec's `max_steps`, else its last logged step); the newest evaluation of a step wins. A job's
final value is the comparison's own pick (the final model's, else the latest step's). Sampled
completions by step s = Σ round/prompts × online.num_samples over the rounds begun at or
before s (reports.story's cost, cumulated). Jobs without the key form the group "(unset)".
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from reports import plots, story
from reports.html import esc, fmt, table
from reports.stats import finite_number, metric_estimate, pick_evaluation

UNSET = "(unset)"


def _mean_se(values: list[float]) -> tuple[float, float | None]:
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
    return statistics.fmean(values), se


def _last_step(entry: dict[str, Any]) -> int | None:
    steps = [int(m["step"]) for m in entry.get("metrics") or [] if "step" in m]
    max_steps = (entry.get("spec") or {}).get("max_steps")
    return int(max_steps) if max_steps else max(steps, default=None)


def job_points(entry: dict[str, Any], metric: str, file_id: str | None) -> dict[int, float]:
    """step → the metric, from the job's evaluations (see the module's docstring)."""
    last = _last_step(entry)
    newest: dict[int, tuple[str, float]] = {}
    for ev in entry.get("evaluations") or []:
        est = metric_estimate(ev, metric) if ev.get("status") == "succeeded" else None
        if est is None or (file_id is not None and ev.get("file_id") != file_id):
            continue
        step = ev.get("step") if ev.get("step") is not None else last
        if step is None:
            continue
        order = f"{ev.get('created_at') or ''}|{ev.get('id') or ''}"
        if int(step) not in newest or order > newest[int(step)][0]:
            newest[int(step)] = (order, est.value)
    return {s: v for s, (_, v) in sorted(newest.items())}


def sampled_by_step(entry: dict[str, Any]) -> list[tuple[int, float]]:
    """(step a round began, completions sampled up to and including it), in step order."""
    k = finite_number(((entry.get("spec") or {}).get("online") or {}).get("num_samples"))
    out, total = [], 0.0
    for m in sorted(entry.get("metrics") or [], key=lambda m: m.get("step", 0)):
        prompts = finite_number(m.get("round/prompts"))
        if prompts is not None and k:
            total += prompts * k
            out.append((int(m["step"]), total))
    return out


def sampled_at(rounds: list[tuple[int, float]], step: int) -> float:
    return max((total for s, total in rounds if s <= step), default=0.0)


def build_groups(
    entries: list[dict[str, Any]], key: str, metric: str, file_id: str | None = None
) -> list[dict[str, Any]]:
    members: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        value = (entry["job"].get("metadata") or {}).get(key)
        members.setdefault(UNSET if value is None else str(value), []).append(entry)
    groups = []
    for name, group in members.items():
        points = [job_points(e, metric, file_id) for e in group]
        rounds = [sampled_by_step(e) for e in group]
        curve = []
        for step in sorted({s for p in points for s in p}):
            have = [(p[step], r) for p, r in zip(points, rounds, strict=True) if step in p]
            m, se = _mean_se([v for v, _ in have])
            sampled = statistics.fmean(sampled_at(r, step) for _, r in have)
            curve.append({"step": step, "mean": m, "se": se, "n": len(have), "sampled": sampled})
        picked = [pick_evaluation(e.get("evaluations") or [], metric, file_id) for e in group]
        finals = [est.value for ev in picked if ev and (est := metric_estimate(ev, metric))]
        costs = [story.cost(e) for e in group]
        walls = [c["wall_clock_s"] for c in costs if c["wall_clock_s"] is not None]
        final = _mean_se(finals) if finals else (None, None)
        groups.append({
            "group": name, "jobs": [e["job"].get("id") for e in group],
            "final": {"mean": final[0], "se": final[1], "n": len(finals)},
            "curve": curve,
            "sampled_completions": statistics.fmean(r[-1][1] if r else 0.0 for r in rounds),
            "wall_clock_s": statistics.fmean(walls) if walls else None,
        })  # fmt: skip
    return groups


def render_groups(doc: dict[str, Any], label: str, percent: bool) -> str:
    groups = (doc.get("groups") or {}).get("groups") or []
    if not groups:
        return ""
    key = doc["groups"]["key"]
    k = 100 if percent else 1

    def show(mean: float | None, se: float | None) -> str:
        if mean is None:
            return "–"
        return f"{k * mean:.1f}" + (f" ± {k * se:.1f}" if se is not None else "")

    panels = [
        plots.band_panel(
            f"{label} by {key} (mean ± SE over jobs)",
            {
                g["group"]: (
                    [c[x] for c in g["curve"]],
                    [c["mean"] for c in g["curve"]],
                    [c["se"] for c in g["curve"]],
                )
                for g in groups
            },
            ylabel=label,
            xlabel=xlabel,
            percent=percent,
        )  # fmt: skip
        for x, xlabel in (("step", "optimizer step"), ("sampled", "completions sampled"))
    ]
    rows = [
        (g["group"], str(len(g["jobs"])), show(g["final"]["mean"], g["final"]["se"]),
         fmt(int(g["sampled_completions"])),
         "–" if g["wall_clock_s"] is None else f"{g['wall_clock_s']:.0f} s")
        for g in groups
    ]  # fmt: skip
    figs = "".join(f"<figure>{p}</figure>" for p in panels if p)
    return (
        f"<h2>Groups by {esc(key)}</h2>"
        + (f'<div class="grid">{figs}</div>' if figs else "")
        + table(
            [
                key,
                "jobs",
                f"final {label} (mean ± SE)",
                "completions sampled (mean)",
                "wall-clock (mean)",
            ],
            rows,
            numeric=[1, 2, 3, 4],
        )  # fmt: skip
    )
