"""The reward interface and the weighted combination of sources (named by
`contract.rewards.RewardSpec`).

A reward source is a callable ``(prompts, completions, records) -> scores`` over *flat, aligned*
lists: entry i is prompt i's text, completion i's text and the training record (the prompt
file's line, so extra columns such as ``answer`` reach it) it came from. Sources are built by
name from the registry (``trainer.rewards.registry``) with their options; nothing else runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol, Self


class RewardFunction(Protocol):
    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[str], records: Sequence[dict]
    ) -> list[float]: ...


class CombinedReward:
    """Weighted sum of named sources; also returns each source's raw scores for logging."""

    def __init__(self, parts: list[tuple[str, float, RewardFunction]]):
        if not parts:
            raise ValueError("a reward needs at least one source")
        names = [name for name, _, _ in parts]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"reward sources must be distinct; repeated: {', '.join(dupes)}")
        self.parts = parts

    def score(
        self, prompts: Sequence[Any], completions: Sequence[str], records: Sequence[dict]
    ) -> tuple[list[float], dict[str, list[float]]]:
        if not len(prompts) == len(completions) == len(records):
            raise ValueError(
                f"prompts, completions and records must align: "
                f"{len(prompts)}, {len(completions)}, {len(records)}"
            )
        totals = [0.0] * len(completions)
        per_source: dict[str, list[float]] = {}
        for name, weight, fn in self.parts:
            scores = [float(s) for s in fn(prompts, completions, records)]
            if len(scores) != len(completions):
                raise RuntimeError(
                    f"reward {name!r} returned {len(scores)} scores "
                    f"for {len(completions)} completions"
                )
            if not all(math.isfinite(s) for s in scores):
                raise RuntimeError(f"reward {name!r} returned a non-finite score")
            per_source[name] = scores
            totals = [t + weight * s for t, s in zip(totals, scores, strict=False)]
        return totals, per_source

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[str], records: Sequence[dict]
    ) -> list[float]:
        """The weighted sum alone, so a combination is itself a :class:`RewardFunction`."""
        return self.score(prompts, completions, records)[0]

    def close(self) -> None:
        """Release what sources hold (the verifier's child process, a reward model)."""
        for _, _, fn in self.parts:
            close = getattr(fn, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
