"""From G scored completions per prompt to DPO pairs, KTO examples and GRPO groups.

Pure functions on plain data, following the paper's Algorithm 1: per prompt, the best and the
worst completion form a pair when their scores differ by at least τ (0.01); narrower prompts
carry too little signal and are dropped (about 18% in the paper's instruction-following runs).

Rules, decided here once:

* **Ties.** The best is the *first* completion with the maximum score, the worst the *last* with
  the minimum, so the two are distinct whenever G ≥ 2, and the choice is deterministic.
* **τ.** A prompt is kept when ``max − min ≥ τ``. With τ = 0 a prompt whose completions all
  score the same is kept too (and gives a pair of equally good completions); τ < 0 is refused.
* **G < 2.** One completion can form neither a pair nor a group: always dropped.
* **KTO.** Each kept pair becomes one desirable and one undesirable example (the paper builds
  DPO pairs first and splits them, rather than thresholding scores directly).
* **GRPO.** ``keep="all"`` (default; the math setup, groups of G) keeps every completion with its
  raw score; ``keep="extremes"`` keeps only the DPO pair with its raw scores (the paper's
  instruction-following online GRPO, groups of 2). ``zero_variance="drop"`` (default) applies
  the τ filter, so groups whose scores are all equal (zero advantages, no policy gradient, but
  they would still dilute DAPO's token-level mean and add KL) are dropped: DAPO's
  dynamic-sampling filter. ``zero_variance="keep"`` keeps every group, as the paper's math setup
  does (the authors' code subclasses TRL's GRPO trainer, which filters none).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

DEFAULT_TAU = 0.01


@dataclass(frozen=True)
class Scored:
    """One sampled completion of prompt ``prompt_index`` with its (combined) reward."""

    prompt_index: int
    text: str
    token_ids: tuple[int, ...]
    score: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.score):
            raise ValueError(f"non-finite score {self.score} for prompt {self.prompt_index}")


@dataclass(frozen=True)
class PreferencePair:
    prompt_index: int
    chosen: Scored
    rejected: Scored

    @property
    def margin(self) -> float:
        return self.chosen.score - self.rejected.score


@dataclass(frozen=True)
class UnpairedExample:
    prompt_index: int
    completion: Scored
    desirable: bool


@dataclass(frozen=True)
class Group:
    """A GRPO group: completions of one prompt, in sampling order, with raw scores."""

    prompt_index: int
    completions: tuple[Scored, ...]

    @property
    def scores(self) -> list[float]:
        return [c.score for c in self.completions]


def attach_scores(
    completions: Sequence[Sequence[Any]], scores: Sequence[float]
) -> list[list[Scored]]:
    """Join a sampler's output (per prompt, its completions) with rewards computed over the same
    completions flattened prompt by prompt, i.e. ``[c for group in completions for c in group]``.

    Duck-typed on ``prompt_index``/``text``/``token_ids`` so this module stays free of the
    sampling code.
    """
    flat = [c for group in completions for c in group]
    if len(flat) != len(scores):
        raise ValueError(f"{len(scores)} scores for {len(flat)} completions")
    out: list[list[Scored]] = []
    it = iter(scores)
    for group in completions:
        out.append(
            [Scored(c.prompt_index, c.text, tuple(c.token_ids), float(next(it))) for c in group]
        )
    return out


def group_by_prompt(scored: Sequence[Scored]) -> list[list[Scored]]:
    """Completions grouped per prompt, groups ordered by prompt index, members in input order."""
    groups: dict[int, list[Scored]] = {}
    for item in scored:
        groups.setdefault(item.prompt_index, []).append(item)
    return [groups[k] for k in sorted(groups)]


def score_spread(group: Sequence[Scored]) -> float:
    scores = [c.score for c in group]
    return max(scores) - min(scores) if scores else 0.0


def best_and_worst(group: Sequence[Scored]) -> tuple[Scored, Scored]:
    """(first argmax, last argmin); distinct items when len(group) ≥ 2."""
    scores = [c.score for c in group]
    best = scores.index(max(scores))
    worst = len(scores) - 1 - scores[::-1].index(min(scores))
    return group[best], group[worst]


def _kept(group: Sequence[Scored], tau: float) -> bool:
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    if len({c.prompt_index for c in group}) > 1:
        raise ValueError("a group mixes completions of different prompts")
    return len(group) >= 2 and score_spread(group) >= tau


def dpo_pairs(groups: Sequence[Sequence[Scored]], tau: float = DEFAULT_TAU) -> list[PreferencePair]:
    """One (best, worst) pair per prompt whose score spread is at least ``tau``."""
    pairs = []
    for group in groups:
        if _kept(group, tau):
            best, worst = best_and_worst(group)
            pairs.append(PreferencePair(best.prompt_index, best, worst))
    return pairs


def kto_examples(pairs: Sequence[PreferencePair]) -> list[UnpairedExample]:
    """Split pairs into unpaired examples: chosen desirable, rejected undesirable, interleaved."""
    out = []
    for pair in pairs:
        out.append(UnpairedExample(pair.prompt_index, pair.chosen, True))
        out.append(UnpairedExample(pair.prompt_index, pair.rejected, False))
    return out


def grpo_groups(
    groups: Sequence[Sequence[Scored]],
    tau: float = DEFAULT_TAU,
    keep: Literal["all", "extremes"] = "all",
    zero_variance: Literal["drop", "keep"] = "drop",
) -> list[Group]:
    """Groups with raw scores for GRPO's group-relative advantages (see module docstring)."""
    if keep not in ("all", "extremes"):
        raise ValueError(f"keep must be 'all' or 'extremes', got {keep!r}")
    if zero_variance not in ("drop", "keep"):
        raise ValueError(f"zero_variance must be 'drop' or 'keep', got {zero_variance!r}")
    out = []
    for group in groups:
        if not _kept(group, tau if zero_variance == "drop" else 0.0):
            continue
        members = tuple(group) if keep == "all" else best_and_worst(group)
        out.append(Group(group[0].prompt_index, tuple(members)))
    return out
