"""DPO on (prompt, chosen, rejected) pairs: rows are all chosen, then all rejected."""

from __future__ import annotations

from collections.abc import Sequence

from contract.spec import DPOConfig
from trainer.losses.dpo import dpo_loss
from trainer.online.pairs import dpo_pairs
from trainer.recipes.base import LossContext, ObjectiveRecipe, build_pairs, fit_pair


class DPORecipe(ObjectiveRecipe[DPOConfig]):
    def build(self, fmt, records, chat):
        return build_pairs(records, chat)

    def pack(self, example):
        return example, ()

    def unpack(self, seqs, numbers):
        return seqs[0], seqs[1]

    def from_samples(self, groups, prompt_ids, chat, online):
        """Online: the best and worst completion of each prompt whose spread is ≥ τ."""
        pairs = (
            fit_pair(chat, prompt_ids[p.prompt_index], p.chosen, p.rejected)
            for p in dpo_pairs(groups, online.tau)
        )
        return [p for p in pairs if p is not None]

    def sequences(self, example):
        return list(example)

    def rows(self, examples: Sequence, mb, chat):
        return [examples[i][0] for i in mb.indices] + [examples[i][1] for i in mb.indices]

    def loss(self, pol, ref, batch, mb, examples, ctx: LossContext):
        n = len(mb.indices)
        mask = batch.mask.to(pol.device)  # a no-op for the step's device batch
        return dpo_loss(
            pol[:n],
            ref[:n],
            mask[:n],
            pol[n:],
            ref[n:],
            mask[n:],
            self.cfg,
            **ctx.sequence_options(mb),
        )
