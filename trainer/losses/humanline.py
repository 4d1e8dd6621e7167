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

In training the trainer passes a :class:`RowDraws` where a generator goes (DPO, KTO): M is then
the batch maximum over the step's *whole* batch (every micro-batch, every rank) and each
token's draws are tied to its example and position, so a job gives the same result whatever
its micro-batch split (trainer.stepwide; issue 38). A generator (GRPO, unit tests) keeps the
per-call maximum and draws in call order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import torch

from contract.spec import HumanlineParams


@dataclass
class StepDraws:
    """Sample mode over one step's whole batch (trainer.stepwide builds it once a step).

    `log_mp`, `log_mr`: log M_P and log M_R, 0-d float64, the bounds every call of the step
    uses. `log_bp`, `log_br`: [CALLS × len(share), width] float64 log Beta draws: row slot
    `c × len(share) + i` holds the draws of the i-th example of this process's share of the
    step (`share`: dataset index -> i) in its micro-batch's c-th call (DPO: chosen, then
    rejected; KTO: the rows, then the mismatched rows), one per completion token in order."""

    CALLS = 2
    log_mp: torch.Tensor
    log_mr: torch.Tensor
    log_bp: torch.Tensor
    log_br: torch.Tensor
    share: dict[int, int]

    def micro(self, indices: Sequence[int]) -> RowDraws:
        """The draws of a micro-batch of these examples (dataset indices, in its order)."""
        slots = torch.tensor([self.share[i] for i in indices], device=self.log_bp.device)
        return RowDraws(self, slots)


class RowDraws:
    """One micro-batch's view of a StepDraws: each call of token_log_ratios takes the next
    call's slots (a generator's place, so the losses pass it on unchanged)."""

    def __init__(self, step: StepDraws, slots: torch.Tensor):
        self.step, self.slots, self.calls = step, slots, 0

    def take(self, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T] log B_P and log B_R for the next call's rows: a row's j-th kept token
        (its j-th completion token, whatever the padding) gets draw j of its slot."""
        if self.calls >= StepDraws.CALLS or keep.shape[0] != self.slots.numel():
            raise RuntimeError("humanline draws asked for rows the step did not draw")
        slots = self.slots + self.calls * len(self.step.share)
        self.calls += 1
        # the j-th kept token's column among the width drawn (padding takes any; it is masked)
        j = (keep.long().cumsum(-1) - 1).clamp(0, self.step.log_bp.shape[1] - 1)
        return self.step.log_bp[slots].gather(1, j), self.step.log_br[slots].gather(1, j)


Draws: TypeAlias = torch.Generator | RowDraws | None  # a generator, or the step's draws
_Humanline = Callable[
    [torch.Tensor, torch.Tensor, HumanlineParams, Draws],
    tuple[torch.Tensor, torch.Tensor],
]


def _clip(
    raw: torch.Tensor, keep: torch.Tensor, hp: HumanlineParams, generator: Draws
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
    raw: torch.Tensor, keep: torch.Tensor, hp: HumanlineParams, generator: Draws
) -> tuple[torch.Tensor, torch.Tensor]:
    """Humanline sampling, compared in log space: ``raw < log M_P + log B_P`` or ``−raw < ...``.

    B_P is drawn for every token before B_R, so a seeded generator gives the same rejections.
    A RowDraws brings the step's draws and bounds instead (see the module docstring).
    """
    r64 = raw.detach().double()
    if isinstance(generator, RowDraws):
        log_bp, log_br = generator.take(keep)
        log_mp, log_mr = generator.step.log_mp, generator.step.log_mr
    else:
        log_bp = _beta(hp.gamma_P, hp.beta_P, raw, generator).log()
        log_br = _beta(hp.gamma_R, hp.beta_R, raw, generator).log()
        log_mp, log_mr = _log_bound(hp.M_P, r64, keep), _log_bound(hp.M_R, -r64, keep)
    rejected = (r64 < log_mp + log_bp) | (-r64 < log_mr + log_br)
    return torch.where(rejected, raw.detach(), raw), rejected


_MODES: dict[str, _Humanline] = {"clip": _clip, "sample": _sample}


def token_log_ratios(
    lp_pol: torch.Tensor,
    lp_ref: torch.Tensor,
    mask: torch.Tensor,
    humanline: HumanlineParams | None,
    generator: Draws = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``log π − log π_ref`` [B, T], humanline-clipped or -sampled when asked.

    Returns ``(r, rejected)``: ``r`` is 0 wherever ``mask`` is 0, and ``rejected`` marks the
    completion tokens clamped (clip) or rejected (sample). Masked positions may hold anything
    (padding, ``-inf``): ``torch.where`` drops them before any arithmetic reaches the loss and
    routes them a zero gradient. ``generator`` drives the Beta draws of ``sample`` mode (it must
    live on the tensors' device; None uses the global RNG), or is a RowDraws (the step's
    draws and bounds); ``clip`` draws nothing.
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


def draw_step(
    hp: HumanlineParams,
    tops: Sequence[tuple[torch.Tensor, torch.Tensor]],
    share: dict[int, int],
    width: int,
    generator: torch.Generator | None,
    reduce_max: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> StepDraws:
    """A step's StepDraws: `tops` holds each micro-batch's largest log-ratio and largest
    negated log-ratio over its kept tokens (`ratio_tops`); `reduce_max` takes the maximum over
    the ranks. Draws every slot's `width` B_P first, then B_R, from `generator`."""
    top = torch.stack([torch.stack(t) for t in tops]).amax(0)  # [2]: M_P's, M_R's
    if reduce_max is not None:
        top = reduce_max(top)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # nothing kept: 0
    bounds = [top[i] if m == "batch_max" else top.new_tensor(math.log(float(m)))
              for i, m in enumerate((hp.M_P, hp.M_R))]  # fmt: skip
    like = torch.empty(StepDraws.CALLS * len(share), width, device=top.device)
    log_bp = _beta(hp.gamma_P, hp.beta_P, like, generator).log()
    log_br = _beta(hp.gamma_R, hp.beta_R, like, generator).log()
    return StepDraws(bounds[0], bounds[1], log_bp, log_br, share)


def ratio_tops(
    lp_pol: torch.Tensor, lp_ref: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(max, max of the negation) of ``log π − log π_ref`` over the kept tokens, float64
    (-inf when none is kept): one micro-batch's part of the step's M_P and M_R."""
    keep = mask.bool()
    r64 = (lp_pol - lp_ref).detach().double()
    inf = float("-inf")
    return torch.where(keep, r64, inf).amax(), torch.where(keep, -r64, inf).amax()
