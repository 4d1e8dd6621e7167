"""Which training-curve panels a job gets, and warnings about curves that carry no signal.

One place per decision: a panel names the objectives whose trainer logs its metrics (DPO and
KTO never show GRPO's PPO clip fraction, ratio or advantages; only DPO has margins), and the
clamp fraction shows only when humanline is on (without it the fraction is 0 by construction).
A panel whose metrics have no finite value is not drawn: never an empty chart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

ALL = frozenset({"sft", "dpo", "kto", "grpo"})


@dataclass(frozen=True)
class Panel:
    title: str
    metrics: tuple[str, ...]
    ylabel: str
    objectives: frozenset[str] = ALL
    humanline_only: bool = False
    logy: bool = False


PANELS: tuple[Panel, ...] = (
    Panel("Loss", ("loss",), "loss"),
    Panel(
        "Implicit rewards (β · log-ratio)",
        ("rewards/chosen", "rewards/rejected"),
        "reward",
        frozenset({"dpo", "kto"}),
    ),
    Panel(
        "Reward margin and pair accuracy",
        ("rewards/margins", "rewards/accuracies"),
        "margin / accuracy",
        frozenset({"dpo"}),
    ),
    Panel(
        "Mean token log-ratio to reference", ("logratio/mean",), "log π/π_ref", frozenset({"dpo"})
    ),
    Panel("KL to reference", ("kl",), "KL (nats)", frozenset({"kto", "grpo"})),
    Panel(
        "Desirable / undesirable per batch",
        ("count/desirable", "count/undesirable"),
        "examples",
        frozenset({"kto"}),
    ),
    Panel("PPO clip fraction", ("clip_frac",), "fraction of tokens", frozenset({"grpo"})),
    Panel("Policy / old-policy ratio", ("ratio/mean",), "mean ratio", frozenset({"grpo"})),
    Panel("Group advantage", ("advantages/mean",), "mean advantage", frozenset({"grpo"})),
    Panel("Humanline clamp fraction", ("clamp_frac",), "fraction of tokens", humanline_only=True),
    Panel("Gradient norm (before clipping)", ("grad_norm",), "L2 norm"),
    Panel("Learning rate", ("lr",), "learning rate"),
    Panel("Throughput", ("tokens_per_s",), "tokens / s"),
    # async online (contract.online_async): where each process's time went, and how stale the
    # samples were; drawn only for async jobs (no other job logs these)
    Panel(
        "Async utilisation: seconds per step",
        ("step_time", "async/sampler_busy_time", "async/wait_time", "async/publish_time"),
        "seconds",
        frozenset({"dpo", "grpo"}),
    ),
    Panel(
        "Async utilisation: shares of the step",
        ("async/sampler_busy_share", "async/trainer_wait_share"),
        "share of the trainer's step",
        frozenset({"dpo", "grpo"}),
    ),
    Panel(
        "Sample lag (steps behind the trainer)", ("async/lag",), "steps", frozenset({"dpo", "grpo"})
    ),
)

# A curve exactly 0 at every logged step: nothing is being learned from these.
FLAT_ZERO = {
    "loss": "the loss is 0 at every logged step",
    "grad_norm": "the gradient norm is 0 at every logged step: no update moves the model "
    "(GRPO: every group's rewards are equal, so every advantage is 0; no reward variance)",
    "rewards/margins": "the reward margin is 0 at every logged step: chosen and rejected "
    "are scored the same",
}


def _finite(values: list[Any]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def panels_for(
    series: dict[str, dict[str, list]], objective: str | None, humanline: bool | None
) -> list[tuple[Panel, dict[str, tuple[list, list]]]]:
    """The panels to draw with their data. Unknown objective: every panel with data;
    unknown humanline: the clamp panel when its curve is not all zero."""
    out = []
    for panel in PANELS:
        if objective in ALL and objective not in panel.objectives:
            continue
        if panel.humanline_only and humanline is False:
            continue
        present = {
            n: (series[n]["steps"], series[n]["values"])
            for n in panel.metrics
            if n in series and _finite(series[n]["values"])
        }
        if panel.humanline_only and humanline is None:
            if not any(v != 0 for _, ys in present.values() for v in _finite(ys)):
                continue
        if present:
            out.append((panel, present))
    return out


def flat_zero_warnings(series: dict[str, dict[str, list]]) -> list[str]:
    out = []
    for name, message in FLAT_ZERO.items():
        values = _finite((series.get(name) or {}).get("values") or [])
        if len(values) >= 2 and all(v == 0 for v in values):
            out.append(f"Flat at zero: {message}.")
    return out


def objective_of(spec: dict[str, Any] | None, job: dict[str, Any]) -> str | None:
    obj = (spec or {}).get("objective") or job.get("objective")
    name = obj.get("name") if isinstance(obj, dict) else obj
    return str(name).lower() if name else None


def humanline_of(spec: dict[str, Any] | None, job: dict[str, Any]) -> bool | None:
    spec = spec or {}
    if "humanline" in spec:
        return bool(spec["humanline"])
    variant = job.get("variant")
    return None if variant is None else "humanline" in str(variant)
