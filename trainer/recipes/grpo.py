"""Offline GRPO (paper, Algorithm 2): each (x, y_w, y_l) pair is a group of two, A = +1/−1."""

from __future__ import annotations

from typing import ClassVar, Sequence

import torch

from trainer.losses.grpo import grpo_loss
from trainer.recipes.base import LossContext, build_pairs
from trainer.spec.job import GRPOConfig, JobSpec


class GRPORecipe:
    accepts: ClassVar[tuple[str, ...]] = ("preference",)
    token_level: ClassVar[bool] = True

    def __init__(self, spec: JobSpec):
        self.cfg: GRPOConfig = spec.objective  # type: ignore[assignment]
        self.epsilon = spec.grpo_epsilon

    def build(self, fmt, records, chat):
        return build_pairs(records, chat)

    def rows(self, examples: Sequence, mb, chat):
        return [seq for i in mb.indices for seq in examples[i]]  # w0, l0, w1, l1, ...

    def loss(self, pol, ref, batch, mb, examples, ctx: LossContext):
        advantages = torch.tensor([1.0, -1.0] * len(mb.indices), device=pol.device)
        return grpo_loss(
            pol, ref, batch.mask.to(pol.device), advantages, self.epsilon, self.cfg.beta_kl,
            humanline=ctx.humanline, generator=ctx.generator,
            token_normalizer=ctx.token_normalizer,
        )
