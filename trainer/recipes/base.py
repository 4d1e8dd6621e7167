"""What an objective contributes to the shared training loop (trainer.train).

An objective turns records into examples, an examples' micro-batch into the sequences to
score, and scored sequences into a loss. Everything else (optimizer, syncing, checkpoints,
distribution) is the loop's, written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Protocol, Sequence

import torch

from trainer.losses import LossOutput
from trainer.plan import MicroBatch
from trainer.spec.job import HumanlineParams
from trainer.tokenize import ChatTokenizer, TokenBatch, TokenSeq


@dataclass
class LossContext:
    humanline: HumanlineParams | None
    length_normalize: bool
    generator: torch.Generator | None = None
    token_normalizer: float | None = None  # token-level objectives: global tokens per process
    kl_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None  # gathers across ranks


class Recipe(Protocol):
    token_level: ClassVar[bool]  # loss is a mean over the whole batch's tokens (DAPO)
    examples_per_prompt: ClassVar[int]  # online: examples one kept prompt yields

    def build(self, fmt: str, records: Sequence[dict], chat: ChatTokenizer) -> list[Any]: ...

    def from_samples(self, groups: Sequence[Sequence[Any]], prompt_ids: Sequence[list[int]],
                     chat: ChatTokenizer, online: Any) -> list[Any]: ...

    def sequences(self, example: Any) -> list[TokenSeq]: ...

    def rows(self, examples: Sequence[Any], mb: MicroBatch, chat: ChatTokenizer) -> list[TokenSeq]: ...

    def loss(
        self, pol: torch.Tensor, ref: torch.Tensor, batch: TokenBatch, mb: MicroBatch,
        examples: Sequence[Any], ctx: LossContext,
    ) -> LossOutput: ...


def build_pairs(records: Sequence[dict], chat: ChatTokenizer) -> list[tuple[TokenSeq, TokenSeq]]:
    """(chosen, rejected) token sequences; pairs with an empty completion are dropped."""
    pairs = []
    for r in records:
        seqs = chat.sequences(r["prompt"], [r["chosen"], r["rejected"]])
        if seqs is not None:
            pairs.append((seqs[0], seqs[1]))
    return pairs


def fit_pair(chat: ChatTokenizer, prompt_ids: list[int], chosen, rejected) -> tuple[TokenSeq, TokenSeq] | None:
    """Two sampled completions (anything with `token_ids`) of one prompt, fitted to max_length."""
    a, b = chat.fit(prompt_ids, list(chosen.token_ids)), chat.fit(prompt_ids, list(rejected.token_ids))
    return None if a is None or b is None else (a, b)
