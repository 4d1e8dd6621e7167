"""Reward sources for online data: a verifier, format rules and a reward model, by name.

``combine([RewardSpec(...), ...]).score(prompts, completions, records)`` returns the weighted
totals and each source's raw scores. Importing this package needs neither torch nor
math-verify (they load when a source that needs them is built).
"""

from contract.rewards import RewardSpec
from trainer.rewards.base import CombinedReward, RewardFunction
from trainer.rewards.format import format_score, tag_count_score
from trainer.rewards.registry import MATH_REWARDS, REWARDS, build_reward, combine
from trainer.rewards.verifier import extract_answer

__all__ = [
    "MATH_REWARDS",
    "REWARDS",
    "CombinedReward",
    "RewardFunction",
    "RewardSpec",
    "build_reward",
    "combine",
    "extract_answer",
    "format_score",
    "tag_count_score",
]
