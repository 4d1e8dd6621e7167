"""KTO with the mismatched-pair reference point z0 (DESIGN.md §2)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from contract.spec import HumanlineParams, KTOConfig
from trainer.losses.humanline import Draws, clamp_fraction, sequence_rewards, token_log_ratios
from trainer.losses.types import LossOutput, detached


def kto_loss(
    pol: torch.Tensor,
    ref: torch.Tensor,
    mask: torch.Tensor,
    labels: torch.Tensor,
    kl_pol: torch.Tensor,
    kl_ref: torch.Tensor,
    kl_mask: torch.Tensor,
    cfg: KTOConfig,
    humanline: HumanlineParams | None = None,
    length_normalize: bool = False,
    generator: Draws = None,
    kl_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    z0: torch.Tensor | None = None,
) -> LossOutput:
    """Mean over examples of ``λ_D (1 − σ(β (R − z0)))`` (desirable) or ``λ_U (1 − σ(β (z0 − R)))``.

    ``labels`` [B] is True for desirable examples. ``kl_*`` are the per-token log-probs of the
    mismatched pairs (x, y'); ``z0 = max(0, Σ R_kl / #{R_kl ≠ 0})`` is detached (it is a reference
    point, not something to optimise): the mean over the mismatched rewards that are not exactly
    zero, as the paper's listing and the authors' code (HALOs ``KTOTrainer.loss``: "sum of
    non-empty KL examples" / "number of non-empty KL examples") compute it, so a pair humanline
    rejected entirely does not pull z0 towards 0. Its rewards get the same humanline treatment
    and the same length normalisation as R, so both live on one scale. ``kl_reduce`` maps the
    local [B] mismatched rewards to the tensor reduced (the recipe passes an all-gather under DDP
    so every rank uses the same z0); the default is the local batch. A given ``z0`` (the
    trainer's, over the step's whole batch: `reference_point`) is used as is, and ``kl_*``
    are then not read.

    Metrics: ``kl`` is z0; ``rewards/chosen`` and ``rewards/rejected`` are means of β·R over the
    desirable and undesirable examples (TRL's convention), left out when the batch has none;
    ``clamp_frac`` covers the examples' tokens, not the mismatched ones.
    """
    r, clamped = token_log_ratios(pol, ref, mask, humanline, generator)
    reward = sequence_rewards(r, mask, length_normalize)
    if z0 is None:
        kl = mismatched_rewards(kl_pol, kl_ref, kl_mask, humanline, length_normalize, generator)
        z0 = reference_point([kl], kl_reduce)

    # counted on the host copy the recipe passes (no device sync): it decides which metrics exist
    n_d = int(sum(labels.tolist())) if labels.device.type == "cpu" else None
    desirable = labels.to(reward.device, non_blocking=True).bool()
    # One expression for both kinds: the sign flips the margin, the weight picks λ_D or λ_U.
    # Built in the reward's dtype: torch.where on Python floats would round λ through float32.
    sign = torch.where(desirable, 1.0, -1.0).to(reward.dtype)
    lambdas = torch.tensor([cfg.lambda_u, cfg.lambda_d], dtype=reward.dtype, device=reward.device)
    weight = lambdas[desirable.long()]
    losses = weight * (1.0 - torch.sigmoid(cfg.beta * sign * (reward - z0)))
    loss = losses.mean()

    with torch.no_grad():
        beta_reward = cfg.beta * reward
        n_d = int(desirable.sum()) if n_d is None else n_d
        n_u = desirable.numel() - n_d
        values: dict[str, torch.Tensor | float] = {
            "loss": loss,
            "kl": z0,
            "clamp_frac": clamp_fraction(clamped, mask),
            "count/desirable": float(n_d),
            "count/undesirable": float(n_u),
        }
        if n_d:
            values["rewards/chosen"] = torch.where(desirable, beta_reward, 0.0).sum() / n_d
        if n_u:
            values["rewards/rejected"] = torch.where(desirable, 0.0, beta_reward).sum() / n_u
    return LossOutput(loss=loss, metrics=detached(values))


@torch.no_grad()
def mismatched_rewards(
    kl_pol: torch.Tensor,
    kl_ref: torch.Tensor,
    kl_mask: torch.Tensor,
    humanline: HumanlineParams | None,
    length_normalize: bool,
    generator: Draws = None,
) -> torch.Tensor:
    """[M] sequence rewards of mismatched pairs, humanline-treated like R (sample mode only
    detaches, so its values are the raw ones: a caller may pass humanline None for it)."""
    r_kl, _ = token_log_ratios(kl_pol, kl_ref, kl_mask, humanline, generator)
    return sequence_rewards(r_kl, kl_mask, length_normalize)


@torch.no_grad()
def reference_point(
    rewards: list[torch.Tensor],
    kl_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """z0 = max(0, Σ R_kl / #{R_kl ≠ 0}) over every mismatched reward given (all micro-batches
    of a step), reduced across ranks by `kl_reduce` (an all-gather)."""
    local = torch.cat(rewards)
    everyone = kl_reduce(local) if kl_reduce is not None else local
    return (everyone.sum() / (everyone != 0).sum().clamp(min=1)).clamp(min=0)
