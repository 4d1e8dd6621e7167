"""GRPO with humanline's double clip and DAPO token-level normalisation (DESIGN.md §2)."""

from __future__ import annotations

import torch

from contract.spec import HumanlineParams
from trainer.losses.humanline import clamp_fraction, token_log_ratios
from trainer.losses.types import LossOutput, detached, masked_mean


def group_advantages(scores: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """``A = (R − group mean) / (group std + eps)`` for consecutive blocks of ``group_size``.

    The std is the *population* std (``correction=0``), so a group of two with different scores
    gets ``±d/(d + 2·eps) ≈ ±1`` (d = half the score gap) as the paper's online/offline GRPO
    says; TRL uses the unbiased std, which would give ±1/√2. A group whose scores are all equal
    gets 0. ``eps`` only guards that division.
    """
    if group_size < 1 or scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {group_size}")
    groups = scores.reshape(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True, correction=0)
    return ((groups - mean) / (std + eps)).reshape(scores.shape)


def grpo_loss(
    pol: torch.Tensor,
    ref: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    epsilon: float,
    beta_kl: float,
    humanline: HumanlineParams | None = None,
    generator: torch.Generator | None = None,
    token_normalizer: float | None = None,
    behaviour: torch.Tensor | None = None,
    is_cap: float | None = None,
) -> LossOutput:
    """Clipped surrogate ``−min(ρA, clip(ρ, 1−ε, 1+ε)A) + β_KL·kl`` summed over tokens / N.

    ``ρ = exp(r)`` with r the (humanline-clamped) token log-ratio against the reference, so with
    humanline the ratio is clipped twice: once upstream to [ε_P, ε_R], once by ε here, and a
    clamped token gets no surrogate gradient even where the ε-min picks the unclipped branch.
    The k3 KL ``exp(ref − pol) − (ref − pol) − 1`` uses the raw log-probs: it is never clamped.

    With ``behaviour`` (the async sampler's log-probs of the same tokens, at the version that
    sampled them) and ``is_cap``, each token's surrogate is weighed by the truncated importance
    weight ``min(exp(ref − behaviour), is_cap)``, detached: it corrects for the sampler's
    policy where the ratio's denominator is another one (a humanline reference).

    N is ``token_normalizer`` when given (the recipe passes the token count of the whole
    optimizer batch, across ranks and accumulation steps: DAPO's token-level mean), else the
    local completion-token count.

    Metrics: ``kl`` and ``ratio/mean`` are token means; ``clip_frac`` is the fraction of tokens
    where the ε-clip is active, i.e. the min picks the clipped term and it differs
    (ρ > 1+ε with A > 0, or ρ < 1−ε with A < 0; TRL's ``clip_ratio/region_mean``).
    """
    keep = mask.bool()
    r, clamped = token_log_ratios(pol, ref, mask, humanline, generator)
    ratio = torch.exp(r)
    adv = advantages.to(ratio.dtype).unsqueeze(-1)
    surrogate = torch.min(ratio * adv, ratio.clamp(1.0 - epsilon, 1.0 + epsilon) * adv)

    log_ref_over_pol = torch.where(keep, ref - pol, 0.0)
    kl = torch.exp(log_ref_over_pol) - log_ref_over_pol - 1.0
    per_token = -surrogate
    weight = None
    if behaviour is not None and is_cap is not None:
        weight = torch.exp(torch.where(keep, ref - behaviour, 0.0)).clamp(max=is_cap).detach()
        per_token = per_token * weight
    if beta_kl != 0.0:  # skipping it keeps an overflowing exp (inf · 0 = NaN) out of the loss
        per_token = per_token + beta_kl * kl

    total = torch.where(keep, per_token, 0.0).sum()
    denom = token_normalizer if token_normalizer is not None else keep.sum().clamp(min=1)
    loss = total / denom

    with torch.no_grad():
        clipped = ((ratio > 1.0 + epsilon) & (adv > 0)) | ((ratio < 1.0 - epsilon) & (adv < 0))
        metrics = detached(
            {
                "loss": loss,
                "kl": masked_mean(kl, keep),
                "clamp_frac": clamp_fraction(clamped, mask),
                "clip_frac": masked_mean(clipped.to(ratio.dtype), keep),
                "ratio/mean": masked_mean(ratio, keep),
                "advantages/mean": advantages.float().mean(),
                **({"is_weight/mean": masked_mean(weight, keep)} if weight is not None else {}),
            }
        )
    return LossOutput(loss=loss, metrics=metrics)
