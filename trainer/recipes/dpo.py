"""DPO on (prompt, chosen, rejected) pairs: rows are all chosen, then all rejected."""

from __future__ import annotations

from typing import ClassVar, Sequence

from trainer.losses.dpo import dpo_loss
from trainer.recipes.base import LossContext, build_pairs
from trainer.spec.job import DPOConfig, JobSpec


class DPORecipe:
    accepts: ClassVar[tuple[str, ...]] = ("preference",)
    token_level: ClassVar[bool] = False

    def __init__(self, spec: JobSpec):
        self.cfg: DPOConfig = spec.objective  # type: ignore[assignment]

    def build(self, fmt, records, chat):
        return build_pairs(records, chat)

    def rows(self, examples: Sequence, mb, chat):
        return [examples[i][0] for i in mb.indices] + [examples[i][1] for i in mb.indices]

    def loss(self, pol, ref, batch, mb, examples, ctx: LossContext):
        n = len(mb.indices)
        return dpo_loss(
            pol[:n], ref[:n], batch.mask[:n], pol[n:], ref[n:], batch.mask[n:], self.cfg,
            humanline=ctx.humanline, length_normalize=ctx.length_normalize,
            generator=ctx.generator,
        )
