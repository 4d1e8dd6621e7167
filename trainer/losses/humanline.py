"""Humanline token log-ratios (DESIGN.md §2): the one place clipping and sampling happen.

Every loss builds its rewards or ratios from :func:`token_log_ratios`, so humanline is applied
per token *before* any loss sees the log-ratio, and the objectives never branch on it.

- ``clip`` (the paper's default): ``r = clamp(log π − log π_ref, log ε_P, log ε_R)``. The
  clamp's derivative is zero outside the range, which is exactly "detach the rejected tokens".
- ``sample`` (the general form defined in the paper's §4): reject token t when
  ``π/π_ref < M_P·B_P`` or ``π_ref/π < M_R·B_R``, with ``B_P ~ Beta(γ_P, β_P)`` and
  ``B_R ~ Beta(γ_R, β_R)`` drawn per token. M must bound the ratio; ``batch_max`` (the default)
  is the largest ratio over the completion tokens of the call (a micro-batch; DPO's chosen and
  rejected halves each), as the authors' ``get_humanline_mask`` takes it per micro-batch (HALOs,
  ``research`` branch; theirs also counts padding, whose ratio is 1, so their M is never below
  1). A rejected token keeps its log-ratio *value* but is detached, so it still counts in the
  sequence reward (KTO's saturation depends on it) but gets no gradient. By the paper's
  clipping theorem, with ``γ_P = kε_P/M_P, β_P = k(1 − ε_P/M_P),
  γ_R = k/(ε_R M_R), β_R = k(1 − 1/(ε_R M_R))`` and k → ∞ the Beta draws collapse to their
  means and sampling rejects exactly what clip clamps: to sample *around* a clip range, set
  those four from log_eps_P/R (ε = exp(log_eps)) and a fixed M; with the defaults (M =
  ``batch_max``, the authors' Beta parameters) log_eps_P/R play no part in sample mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from contract.spec import HumanlineParams

_Humanline = Callable[
    [torch.Tensor, torch.Tensor, HumanlineParams, torch.Generator | None],
    tuple[torch.Tensor, torch.Tensor],
]


def _clip(
    raw: torch.Tensor, keep: torch.Tensor, hp: HumanlineParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clamp in log space (more precise than clamping the ratio); strict bounds mark clamping."""
    rejected = (raw < hp.log_eps_P) | (raw > hp.log_eps_R)
    return raw.clamp(hp.log_eps_P, hp.log_eps_R), rejected


def _beta(
    concentration1: float,
    concentration0: float,
    like: torch.Tensor,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Per-element Beta draws from ``generator``.

    ``torch.distributions.Beta`` only uses the global RNG; its sampler, ``_sample_dirichlet``,
    takes a generator, and Beta(a, b) is the first coordinate of Dirichlet(a, b). Drawn in
    float64 so tiny concentrations (Beta(γ, 1) of the paper's rejection-sampling proposition)
    do not underflow to 0/0.
    """
    alpha = torch.tensor([concentration1, concentration0], dtype=torch.float64, device=like.device)
    alpha = alpha.expand(*like.shape, 2).contiguous()
    return torch._sample_dirichlet(alpha, generator=generator)[..., 0]


def _log_bound(m: float | str, log_ratio: torch.Tensor, keep: torch.Tensor) -> torch.Tensor | float:
    """log M: the given bound, or the largest log-ratio over the kept tokens (0 if none)."""
    if m != "batch_max":
        return math.log(float(m))
    # no `keep.any()` test: that would wait for the device; -inf (nothing kept) becomes 0
    top = torch.where(keep, log_ratio, float("-inf")).amax()
    return torch.where(torch.isfinite(top), top, torch.zeros_like(top))


def _sample(
    raw: torch.Tensor, keep: torch.Tensor, hp: HumanlineParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Humanline sampling, compared in log space: ``raw < log M_P + log B_P`` or ``−raw < ...``.

    B_P is drawn for every token before B_R, so a seeded generator gives the same rejections.
    """
    log_bp = _beta(hp.gamma_P, hp.beta_P, raw, generator).log()
    log_br = _beta(hp.gamma_R, hp.beta_R, raw, generator).log()
    r64 = raw.detach().double()
    log_mp, log_mr = _log_bound(hp.M_P, r64, keep), _log_bound(hp.M_R, -r64, keep)
    rejected = (r64 < log_mp + log_bp) | (-r64 < log_mr + log_br)
    return torch.where(rejected, raw.detach(), raw), rejected


_MODES: dict[str, _Humanline] = {"clip": _clip, "sample": _sample}


def token_log_ratios(
    lp_pol: torch.Tensor,
    lp_ref: torch.Tensor,
    mask: torch.Tensor,
    humanline: HumanlineParams | None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``log π − log π_ref`` [B, T], humanline-clipped or -sampled when asked.

    Returns ``(r, rejected)``: ``r`` is 0 wherever ``mask`` is 0, and ``rejected`` marks the
    completion tokens clamped (clip) or rejected (sample). Masked positions may hold anything
    (padding, ``-inf``): ``torch.where`` drops them before any arithmetic reaches the loss and
    routes them a zero gradient. ``generator`` drives the Beta draws of ``sample`` mode (it must
    live on the tensors' device; None uses the global RNG); ``clip`` draws nothing.
    """
    keep = mask.bool()
    raw = torch.where(keep, lp_pol - lp_ref, 0.0)
    if humanline is None:
        return raw, torch.zeros_like(keep)
    r, rejected = _MODES[humanline.mode](raw, keep, humanline, generator)
    # Re-zero: a clip range that excludes 0 would otherwise move the padding.
    return torch.where(keep, r, 0.0), rejected & keep


def sequence_rewards(
    r: torch.Tensor, mask: torch.Tensor, length_normalize: bool = False
) -> torch.Tensor:
    """Sequence reward ``R = Σ_t r[t]`` over completion tokens, [B].

    With ``length_normalize`` divide by the count of non-zero token log-ratios, as the paper's
    ``get_sequence_rewards`` does (a token whose policy and reference agree exactly adds nothing
    and is not counted). A row with no non-zero token divides by 1, so it stays 0, not NaN.
    """
    r = torch.where(mask.bool(), r, 0.0)
    total = r.sum(-1)
    if not length_normalize:
        return total
    count = (r != 0).sum(-1).clamp(min=1).to(r.dtype)
    return total / count


def clamp_fraction(rejected: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Fraction of completion tokens that humanline clamped or rejected (0 for an empty mask)."""
    return rejected.sum() / mask.bool().sum().clamp(min=1)
