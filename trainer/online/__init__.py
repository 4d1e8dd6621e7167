"""Online data: turn sampled, scored completions into training examples (paper, Algorithm 1)."""

from trainer.online.pairs import (
    DEFAULT_TAU,
    Group,
    PreferencePair,
    Scored,
    UnpairedExample,
    attach_scores,
    dpo_pairs,
    group_by_prompt,
    grpo_groups,
    kto_examples,
    score_spread,
)

__all__ = [
    "DEFAULT_TAU",
    "Group",
    "PreferencePair",
    "Scored",
    "UnpairedExample",
    "attach_scores",
    "dpo_pairs",
    "group_by_prompt",
    "grpo_groups",
    "kto_examples",
    "score_spread",
]
