"""What a step's losses need from its whole batch, computed before the first micro-batch's loss,
so a job gives the same result whatever its split into micro-batches (issue 38): the split
follows the memory of the GPU a job lands on (and halves after an out-of-memory error).

- KTO's reference point z0 is the mean over *every* mismatched pair of the step, on every
  rank. The mismatched rows are scored by the policy under no_grad anyway (trainer.logps.
  batch_logps); they are now scored for all micro-batches first, kept on the batch
  (`TokenBatch.aux_logps`), and not scored again: no extra forward.
- Humanline sample mode's M_P, M_R are the batch maxima of the step's whole batch (every
  micro-batch, both halves of a DPO pair, every rank), and each token's Beta draws are tied to
  its example and completion position (trainer.losses.humanline.StepDraws), not to the order
  and shapes of the calls. M needs every row's log-ratio before any backward: one extra
  no-grad policy forward of the step's rows, in sample mode only (about +1/3 of a step's
  compute; clip mode, the default, pays nothing). GRPO keeps its per-call M (its recipe passes
  the step's generator itself).

Every micro-batch's device batch and reference log-probs are made here, once, in order, and
handed to the loop.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist

from trainer.logps import token_logps
from trainer.losses.humanline import draw_step, ratio_tops
from trainer.plan import MicroBatch
from trainer.recipes import LossContext
from trainer.tokenize import TokenBatch

SAMPLED_OBJECTIVES = ("dpo", "kto")  # whose recipes pass ctx.sequence_options(mb) to the loss


def step_inputs(
    trainer, step: int, micro: list[MicroBatch], batches: list[TokenBatch], ctx: LossContext
) -> list[tuple[MicroBatch, TokenBatch, TokenBatch, torch.Tensor]]:
    """(micro-batch, host batch, device batch, reference log-probs) of each micro-batch of
    `step`, with `ctx` holding
    the step-wide z0 and draws its objective needs (see the module docstring). Collective
    under FSDP: every rank runs the same forwards. Runs inside the step's autocast region."""
    spec, device = trainer.spec, trainer.accelerator.device
    temperature = spec.logps_temperature
    scored = [b.to(device) for b in batches]  # once: the reference, the policy and the loss
    refs = [trainer.reference.logps(step, m, s) for m, s in enumerate(scored)]
    if any(s.aux is not None for s in scored):  # KTO: its mismatched rows, all first
        with torch.no_grad():
            scored = [
                replace(s, aux_logps=token_logps(trainer.model, s.aux, temperature))
                if s.aux is not None
                else s
                for s in scored
            ]
        trainer.recipe.whole_step(scored, refs, ctx)
    hp = trainer.humanline
    if hp is not None and hp.mode == "sample" and spec.objective.name in SAMPLED_OBJECTIVES:
        tops = []
        with torch.no_grad():
            for s, ref in zip(scored, refs, strict=True):
                pol = token_logps(trainer.model, s, temperature)
                n = s.mask.shape[0]
                tops.append(ratio_tops(pol, ref[:n, : pol.shape[1]], s.mask))
        share = {i: k for k, i in enumerate(i for mb in micro for i in mb.indices)}
        ctx.draws = draw_step(hp, tops, share, spec.max_length, ctx.generator, _max_over_ranks)
    return list(zip(micro, batches, scored, refs, strict=True))


def _max_over_ranks(t: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t
