"""How a job names its reward sources. The sources themselves (code) live in
``trainer.rewards.registry``, keyed by exactly these names (a test holds the two together)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# The only reward sources a job may name: no user code ever runs in a worker.
REWARD_NAMES: frozenset[str] = frozenset(
    {"math_accuracy", "format", "tag_count", "reward_model", "string_check"}
)


class RewardSpec(BaseModel):
    """One source of the job's reward: ``{"name": "math_accuracy", "weight": 8}``.

    ``options`` are the factory's keyword arguments (e.g. ``{"path": ...}`` for
    ``reward_model``); they are checked when the source is built.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, examples=["math_accuracy"])
    weight: float = Field(1.0, description="Multiplier in the weighted sum; may be negative.")
    options: dict[str, Any] = Field(default_factory=dict)


# The paper's math setup (Open-R1 rewards, weighted 1/1/8 to emphasise accuracy).
MATH_REWARDS: tuple[RewardSpec, ...] = (
    RewardSpec(name="tag_count", weight=1.0),
    RewardSpec(name="format", weight=1.0),
    RewardSpec(name="math_accuracy", weight=8.0),
)
