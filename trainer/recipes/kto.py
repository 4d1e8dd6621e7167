"""KTO on unpaired examples; paired data is split into a desirable and an undesirable one.

The KL estimate z0 scores mismatched pairs (x_i, y_{i+1}) where i+1 is the next example of the
*global* batch, so z0 does not depend on how the batch is split over processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import torch

from trainer.losses.kto import kto_loss
from trainer.online.pairs import dpo_pairs
from trainer.recipes.base import LossContext, build_pairs, fit_pair
from trainer.spec.job import KTOConfig, JobSpec
from trainer.tokenize import TokenSeq


@dataclass(frozen=True)
class Unpaired:
    seq: TokenSeq
    label: bool


class KTORecipe:
    token_level: ClassVar[bool] = False
    examples_per_prompt: ClassVar[int] = 2

    def __init__(self, spec: JobSpec):
        self.cfg: KTOConfig = spec.objective  # type: ignore[assignment]

    def build(self, fmt, records, chat):
        if fmt == "preference":
            return [Unpaired(s, lbl) for c, r in build_pairs(records, chat) for s, lbl in ((c, True), (r, False))]
        out = []
        for r in records:
            seqs = chat.sequences(r["prompt"], [r["completion"]])
            if seqs is not None:
                out.append(Unpaired(seqs[0], r["label"]))
        return out

    def from_samples(self, groups, prompt_ids, chat, online):
        """Online: DPO's pairs first, then split (as the paper does, rather than thresholds)."""
        out = []
        for p in dpo_pairs(groups, online.tau):
            pair = fit_pair(chat, prompt_ids[p.prompt_index], p.chosen, p.rejected)
            if pair is not None:
                out += [Unpaired(pair[0], True), Unpaired(pair[1], False)]
        return out

    def sequences(self, example):
        return [example.seq]

    def rows(self, examples: Sequence[Unpaired], mb, chat):
        own = [examples[i].seq for i in mb.indices]
        room = chat.max_length
        mismatched = [
            TokenSeq(examples[i].seq.prompt_ids,
                     examples[p].seq.completion_ids[: max(1, room - len(examples[i].seq.prompt_ids))])
            for i, p in zip(mb.indices, mb.partners)
        ]
        return own + mismatched

    def loss(self, pol, ref, batch, mb, examples, ctx: LossContext):
        n = len(mb.indices)
        labels = torch.tensor([examples[i].label for i in mb.indices], device=pol.device)
        return kto_loss(
            pol[:n], ref[:n], batch.mask[:n], labels, pol[n:], ref[n:], batch.mask[n:], self.cfg,
            humanline=ctx.humanline, length_normalize=ctx.length_normalize,
            generator=ctx.generator, kl_reduce=ctx.kl_reduce,
        )
