"""The registered reward sources: the only code a job's reward can run.

A job names sources and their options (``RewardSpec``); it can never supply code. Adding a
source means adding a factory here, reviewed like any other change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from contract.rewards import MATH_REWARDS, RewardSpec
from trainer.rewards.base import CombinedReward, RewardFunction
from trainer.rewards.format import format_reward, tag_count_reward
from trainer.rewards.reward_model import RewardModel
from trainer.rewards.string_check import StringCheck
from trainer.rewards.verifier import MathAccuracy

RewardFactory = Callable[..., RewardFunction]

REWARDS: dict[str, RewardFactory] = {
    "math_accuracy": MathAccuracy,
    "format": format_reward,
    "tag_count": tag_count_reward,
    "reward_model": RewardModel,
    "string_check": StringCheck,
}
__all__ = ["MATH_REWARDS", "REWARDS", "build_reward", "combine"]


def build_reward(spec: RewardSpec) -> RewardFunction:
    factory = REWARDS.get(spec.name)
    if factory is None:
        raise ValueError(
            f"unknown reward {spec.name!r}; registered rewards: {', '.join(sorted(REWARDS))}"
        )
    try:
        return factory(**spec.options)
    except TypeError as exc:  # unknown or missing option
        raise ValueError(f"reward {spec.name!r}: bad options {spec.options}: {exc}") from None


def combine(specs: Sequence[RewardSpec | dict[str, Any]]) -> CombinedReward:
    """Build every source and sum them with their weights (see :class:`CombinedReward`)."""
    parsed = [s if isinstance(s, RewardSpec) else RewardSpec.model_validate(s) for s in specs]
    built: list[tuple[str, float, RewardFunction]] = []
    try:
        for spec in parsed:
            built.append((spec.name, spec.weight, build_reward(spec)))
        return CombinedReward(built)
    except BaseException:
        for _, _, fn in built:  # do not leak a started verifier or a loaded model
            getattr(fn, "close", lambda: None)()
        raise
