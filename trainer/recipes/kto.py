"""KTO on unpaired examples; paired data is split into a desirable and an undesirable one.

The KL estimate z0 scores mismatched pairs (x_i, y_{i+1}) where i+1 is the next example of the
*global* batch, so z0 does not depend on how the batch is split over processes. z0 is a detached
reference point, so the policy scores those rows under no_grad (`no_grad_rows`), as the authors'
KTO trainer does (HALOs ``KTOTrainer.loss`` detaches ``policy_KL_logps``): no activations kept
for them, no backward through them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from contract.spec import KTOConfig
from trainer.losses.kto import kto_loss, mismatched_rewards, reference_point
from trainer.online.pairs import dpo_pairs
from trainer.recipes.base import LossContext, ObjectiveRecipe, build_pairs, fit_pair
from trainer.tokenize import TokenSeq


@dataclass(frozen=True)
class Unpaired:
    seq: TokenSeq
    label: bool


class KTORecipe(ObjectiveRecipe[KTOConfig]):
    examples_per_prompt: ClassVar[int] = 2

    def build(self, fmt, records, chat):
        if fmt == "preference":
            for c, r in build_pairs(records, chat):
                yield Unpaired(c, True)
                yield Unpaired(r, False)
            return
        for r in records:
            seqs = chat.sequences(r["prompt"], [r["completion"]])
            if seqs is not None:
                yield Unpaired(seqs[0], r["label"])

    def pack(self, example: Unpaired):
        return (example.seq,), (1.0 if example.label else 0.0,)

    def unpack(self, seqs, numbers):
        return Unpaired(seqs[0], numbers[0] == 1.0)

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
        return [examples[i].seq for i in mb.indices]

    def no_grad_rows(self, examples: Sequence[Unpaired], mb, chat):
        """The mismatched pairs (x_i, y'_{partner}), cut to fit max_length."""
        room = chat.max_length
        return [
            TokenSeq(
                examples[i].seq.prompt_ids,
                examples[p].seq.completion_ids[: max(1, room - len(examples[i].seq.prompt_ids))],
            )
            for i, p in zip(mb.indices, mb.partners, strict=False)
        ]

    def loss(self, pol, ref, batch, mb, examples, ctx: LossContext):
        n = len(mb.indices)
        labels = torch.tensor([examples[i].label for i in mb.indices])  # host: kto_loss moves it
        mask = batch.row_mask().to(pol.device)  # rows, then the mismatched rows (batch.aux)
        return kto_loss(
            pol[:n],
            ref[:n],
            mask[:n],
            labels,
            pol[n:],
            ref[n:],
            mask[n:],
            self.cfg,
            **ctx.sequence_options(mb),
            kl_reduce=ctx.kl_reduce,
            z0=ctx.z0,
        )

    def whole_step(self, batches, refs, ctx: LossContext) -> None:
        """z0 over the step's whole batch (every micro-batch; every rank through kl_reduce), so
        the split does not change it (issue 38): from the mismatched rows' log-probs the step
        scored first (`aux_logps`). Sample mode's treatment only detaches: raw values."""
        humanline = ctx.humanline if ctx.humanline and ctx.humanline.mode == "clip" else None
        rewards = []
        for batch, ref in zip(batches, refs, strict=True):
            assert batch.aux is not None and batch.aux_logps is not None
            n = batch.mask.shape[0]
            mask = batch.row_mask().to(ref.device)[n:]
            pol = F.pad(batch.aux_logps, (0, ref.shape[1] - batch.aux_logps.shape[1]))  # to W
            rewards.append(mismatched_rewards(pol, ref[n:], mask, humanline, ctx.length_normalize))
        ctx.z0 = reference_point(rewards, ctx.kl_reduce)
