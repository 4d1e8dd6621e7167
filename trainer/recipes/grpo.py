"""GRPO on groups: offline, each (x, y_w, y_l) pair is a group of two with A = +1/−1 (paper,
Algorithm 2); online, each prompt's sampled completions with group-relative advantages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from contract.spec import GRPOConfig, JobSpec
from trainer.losses.grpo import group_advantages, grpo_loss
from trainer.online.pairs import grpo_groups
from trainer.recipes.base import LossContext, ObjectiveRecipe, build_pairs
from trainer.reference import in_layout
from trainer.tokenize import TokenSeq


@dataclass(frozen=True)
class GRPOGroup:
    seqs: tuple[TokenSeq, ...]
    advantages: tuple[float, ...]


class GRPORecipe(ObjectiveRecipe[GRPOConfig]):
    token_level: ClassVar[bool] = True

    def __init__(self, spec: JobSpec):
        super().__init__(spec)
        self.epsilon = spec.grpo_epsilon

    def build(self, fmt, records, chat):
        return (GRPOGroup((w, lose), (1.0, -1.0)) for w, lose in build_pairs(records, chat))

    def pack(self, example: GRPOGroup):
        return example.seqs, example.advantages

    def unpack(self, seqs, numbers):
        return GRPOGroup(tuple(seqs), numbers)

    def from_samples(self, groups, prompt_ids, chat, online):
        """Online: raw scores → A = (R − mean) / std within each kept group."""
        out = []
        for g in grpo_groups(groups, online.tau, online.grpo_keep, online.zero_variance_groups):
            seqs = [chat.fit(prompt_ids[g.prompt_index], list(c.token_ids)) for c in g.completions]
            if all(s is not None for s in seqs):
                adv = group_advantages(torch.tensor(g.scores), len(g.scores)).tolist()
                out.append(GRPOGroup(tuple(seqs), tuple(adv)))
        return out

    def sequences(self, example: GRPOGroup):
        return list(example.seqs)

    def rows(self, examples: Sequence[GRPOGroup], mb, chat):
        return [seq for i in mb.indices for seq in examples[i].seqs]

    def loss(self, pol, ref, batch, mb, examples, ctx: LossContext):
        advantages = torch.tensor(
            [a for i in mb.indices for a in examples[i].advantages], device=pol.device
        )
        behaviour = None
        if ctx.behaviour is not None and ctx.is_cap is not None:  # the sampler's π, this layout
            behaviour = in_layout(ctx.behaviour, batch).to(pol.device)
        return grpo_loss(
            pol,
            ref,
            batch.mask.to(pol.device),
            advantages,
            self.epsilon,
            self.cfg.beta_kl,
            humanline=ctx.humanline,
            generator=ctx.generator,
            token_normalizer=ctx.token_normalizer,
            behaviour=behaviour,
            is_cap=ctx.is_cap,
        )
