"""Rule-based format rewards of the paper's math setup (Open-R1's ``format`` and ``tag_count``).

Both look at the completion text only. They are whitespace-tolerant where Open-R1 demands a
newline around every tag (``<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>``): small models
rarely reproduce the exact newlines, and the layout, not the line breaks, is what matters.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_FORMAT = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*", re.DOTALL)


def format_score(text: str) -> float:
    """1.0 if the *whole* completion is ``<think>…</think>`` then ``<answer>…</answer>``.

    Only whitespace may surround the two blocks. Like Open-R1's pattern, the lazy ``.*?`` still
    lets a block contain stray tags (``<think>a</think><think>b</think><answer>…``);
    ``tag_count`` is what penalises repeated tags.
    """
    return 1.0 if _FORMAT.fullmatch(text) else 0.0


def tag_count_score(text: str) -> float:
    """0.25 for each of the four tags that occurs exactly once (partial credit for layout)."""
    return sum(0.25 for tag in TAGS if text.count(tag) == 1)


def format_reward() -> RuleReward:
    return RuleReward(format_score)


def tag_count_reward() -> RuleReward:
    return RuleReward(tag_count_score)


class RuleReward:
    """A reward that scores each completion's text on its own."""

    def __init__(self, rule):
        self.rule = rule

    def __call__(
        self, prompts: Sequence, completions: Sequence[str], records: Sequence[dict]
    ) -> list[float]:
        return [self.rule(text) for text in completions]
