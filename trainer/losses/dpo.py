"""DPO: ``loss = −log σ(β (R_w − R_l))`` with humanline-aware sequence rewards (DESIGN.md §2)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from contract.spec import DPOConfig, HumanlineParams
from trainer.losses.humanline import Draws, sequence_rewards, token_log_ratios
from trainer.losses.types import LossOutput, detached


def dpo_loss(
    pol_chosen: torch.Tensor,
    ref_chosen: torch.Tensor,
    mask_chosen: torch.Tensor,
    pol_rejected: torch.Tensor,
    ref_rejected: torch.Tensor,
    mask_rejected: torch.Tensor,
    cfg: DPOConfig,
    humanline: HumanlineParams | None = None,
    length_normalize: bool = False,
    generator: Draws = None,
) -> LossOutput:
    """Mean over pairs of ``−log σ(β (R_w − R_l))``.

    Inputs are per-token log-probs [B, T] over completion tokens (chosen and rejected may have
    different T). ``cfg.reference_free`` treats the reference log-probs as 0, so R is the
    policy's own log-likelihood (the spec forbids combining it with humanline, which needs a
    reference to clip against).

    Metrics: ``rewards/*`` are means of β·R (TRL's convention, so the numbers are comparable),
    ``rewards/accuracies`` the fraction of pairs with β·R_w > β·R_l, ``clamp_frac`` the fraction
    of completion tokens (chosen and rejected together) humanline clamped or rejected, and
    ``logratio/mean`` the mean token log-ratio as the loss saw it (after clamping).
    """
    if cfg.reference_free:
        ref_chosen, ref_rejected = torch.zeros_like(ref_chosen), torch.zeros_like(ref_rejected)
    r_w, clamped_w = token_log_ratios(pol_chosen, ref_chosen, mask_chosen, humanline, generator)
    r_l, clamped_l = token_log_ratios(
        pol_rejected, ref_rejected, mask_rejected, humanline, generator
    )
    reward_w = cfg.beta * sequence_rewards(r_w, mask_chosen, length_normalize)
    reward_l = cfg.beta * sequence_rewards(r_l, mask_rejected, length_normalize)
    # logsigmoid is the stable form of log(1 / (1 + exp(−x))) for large |x|.
    loss = -F.logsigmoid(reward_w - reward_l).mean()

    with torch.no_grad():
        n_tokens = mask_chosen.bool().sum() + mask_rejected.bool().sum()
        logratio_sum = r_w.sum() + r_l.sum()  # r is already 0 off the completion
        metrics = detached(
            {
                "loss": loss,
                "rewards/chosen": reward_w.mean(),
                "rewards/rejected": reward_l.mean(),
                "rewards/margins": (reward_w - reward_l).mean(),
                "rewards/accuracies": (reward_w > reward_l).float().mean(),
                "clamp_frac": (clamped_w.sum() + clamped_l.sum()) / n_tokens.clamp(min=1),
                "logratio/mean": logratio_sum / n_tokens.clamp(min=1),
            }
        )
    return LossOutput(loss=loss, metrics=metrics)
