"""GRPO on hand-computed tokens: ε-clip, humanline double clip, k3 KL, DAPO normalisation."""

from __future__ import annotations

import math

import pytest
import torch

from contract.spec import HumanlineParams
from trainer.losses import group_advantages, grpo_loss

NAN, INF = float("nan"), float("inf")
EPS = 0.2


# ---- advantages ----------------------------------------------------------------------------


def test_group_of_two_gives_plus_minus_one():
    a = group_advantages(torch.tensor([0.9, 0.1, -3.0, 5.0]), group_size=2)
    # population std of a pair is half the gap d; A = ±d / (d + eps)
    expected = torch.tensor([0.4 / 0.4001, -0.4 / 0.4001, -4.0 / 4.0001, 4.0 / 4.0001])
    torch.testing.assert_close(a, expected)
    torch.testing.assert_close(a.abs(), torch.ones(4), atol=3e-4, rtol=0)


def test_group_of_four_uses_population_std_per_consecutive_block():
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0, 8.0, 8.0, 8.0, 8.0])
    a = group_advantages(scores, group_size=4)
    std = math.sqrt((1.5**2 + 0.5**2 + 0.5**2 + 1.5**2) / 4)  # divide by n, not n − 1
    expected = [(x - 2.5) / (std + 1e-4) for x in (1, 2, 3, 4)] + [0.0] * 4
    torch.testing.assert_close(a, torch.tensor(expected))


def test_group_size_must_divide_the_scores():
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(6), group_size=4)


# ---- loss ----------------------------------------------------------------------------------


def _batch():
    """ref = 0, so the token log-ratio is lp_pol; row 1's last token is garbage under the mask.
    row 0 (A = +1): [0, 0.5, log 0.5]; row 1 (A = −1): [0.1, −0.5, ·]."""
    pol = torch.tensor([[0.0, 0.5, math.log(0.5)], [0.1, -0.5, NAN]], requires_grad=True)
    ref = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, INF]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return pol, ref, mask, torch.tensor([1.0, -1.0])


# per-token −min(ρA, clip(ρ, 0.8, 1.2)A):
#   row 0, A=+1, ρ = [1, e^0.5 = 1.65, 0.5] → −[1, 1.2 (clipped), 0.5]
#   row 1, A=−1, ρ = [e^0.1, e^−0.5 = 0.61] → [e^0.1, 0.8 (clipped)]
SURROGATE = [-1.0, -1.2, -0.5, math.exp(0.1), 0.8]


def _k3(log_ratio: float) -> float:
    """exp(ref − pol) − (ref − pol) − 1 with ref − pol = −log_ratio."""
    return math.exp(-log_ratio) + log_ratio - 1


def test_grpo_clipped_surrogate_token_mean():
    pol, ref, mask, adv = _batch()
    out = grpo_loss(pol, ref, mask, adv, EPS, beta_kl=0.0)
    assert out.loss.item() == pytest.approx(sum(SURROGATE) / 5, abs=1e-6)
    assert out.metrics["clip_frac"] == pytest.approx(
        2 / 5
    )  # (0,1) high with A>0, (1,1) low with A<0
    assert out.metrics["clamp_frac"] == 0.0
    assert out.metrics["ratio/mean"] == pytest.approx(
        (1 + math.exp(0.5) + 0.5 + math.exp(0.1) + math.exp(-0.5)) / 5
    )
    assert out.metrics["advantages/mean"] == 0.0

    out.loss.backward()
    # unclipped tokens: d(−ρA)/dlp = −ρA; ε-clipped tokens and the masked one: exactly 0
    expected = torch.tensor([[-1.0, 0.0, -0.5], [math.exp(0.1), 0.0, 0.0]]) / 5
    torch.testing.assert_close(pol.grad, expected)
    assert torch.equal(pol.grad == 0, expected == 0)


def test_grpo_k3_kl_is_added_per_token():
    pol, ref, mask, adv = _batch()
    out = grpo_loss(pol, ref, mask, adv, EPS, beta_kl=0.1)
    kls = [_k3(x) for x in (0.0, 0.5, math.log(0.5), 0.1, -0.5)]
    expected = sum(s + 0.1 * k for s, k in zip(SURROGATE, kls, strict=True)) / 5
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    assert out.metrics["kl"] == pytest.approx(sum(kls) / 5, abs=1e-6)


def test_grpo_dapo_normalises_by_tokens_not_sequences():
    pol, ref, mask, adv = _batch()
    out = grpo_loss(pol, ref, mask, adv, EPS, beta_kl=0.0)
    per_sequence = (sum(SURROGATE[:3]) / 3 + sum(SURROGATE[3:]) / 2) / 2
    assert out.loss.item() != pytest.approx(per_sequence)  # unequal lengths: the two differ
    # a global token count (DDP ranks / accumulation steps) replaces the local one
    out = grpo_loss(pol, ref, mask, adv, EPS, beta_kl=0.0, token_normalizer=20.0)
    assert out.loss.item() == pytest.approx(sum(SURROGATE) / 20, abs=1e-6)


def test_grpo_humanline_double_clip():
    """Log-ratios ±2 are clamped to ±1.5 upstream, then the ratio e^±1.5 is still outside 1 ± ε."""
    pol = torch.tensor([[2.0, -2.0, 0.1], [2.0, -2.0, 0.1]], requires_grad=True)
    ref, mask, adv = torch.zeros(2, 3), torch.ones(2, 3), torch.tensor([1.0, -1.0])
    out = grpo_loss(pol, ref, mask, adv, EPS, beta_kl=0.0, humanline=HumanlineParams())
    hi, lo = math.exp(1.5), math.exp(-1.5)
    # A=+1: [−min(e^1.5, 1.2), −min(e^−1.5, 0.8), −e^0.1]
    # A=−1: [max(e^1.5, 1.2), max(e^−1.5, 0.8), e^0.1]
    per_token = [-1.2, -lo, -math.exp(0.1), hi, 0.8, math.exp(0.1)]
    assert out.loss.item() == pytest.approx(sum(per_token) / 6, abs=1e-6)
    assert out.metrics["clamp_frac"] == pytest.approx(4 / 6)

    out.loss.backward()
    # (0,1) and (1,0) take the *unclipped* branch of the ε-min, yet get no gradient: humanline
    expected = torch.tensor([[0.0, 0.0, -math.exp(0.1)], [0.0, 0.0, math.exp(0.1)]]) / 6
    assert torch.equal(pol.grad == 0, expected == 0)
    torch.testing.assert_close(pol.grad, expected)

    plain = pol.detach().clone().requires_grad_()
    grpo_loss(plain, ref, mask, adv, EPS, beta_kl=0.0).loss.backward()
    # without humanline those two unclipped tokens do move: −ρA = −e^−2 and +e^2
    torch.testing.assert_close(plain.grad[0, 1], torch.tensor(-math.exp(-2.0) / 6))
    torch.testing.assert_close(plain.grad[1, 0], torch.tensor(math.exp(2.0) / 6))


def test_grpo_kl_gradient_ignores_the_humanline_clamp():
    pol = torch.tensor([[3.0, 0.0]], requires_grad=True)
    out = grpo_loss(pol, torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([0.0]), EPS,
                    beta_kl=0.1, humanline=HumanlineParams())  # fmt: skip
    assert out.metrics["kl"] == pytest.approx(_k3(3.0) / 2, abs=1e-6)  # raw, not clamped to 1.5
    out.loss.backward()
    # d/dpol of β(e^−x + x − 1) = β(1 − e^−x) at x = 3; the surrogate (A = 0) contributes nothing
    torch.testing.assert_close(pol.grad, torch.tensor([[0.1 * (1 - math.exp(-3.0)) / 2, 0.0]]))


def test_grpo_first_step_ratio_one_still_has_gradient():
    pol = torch.randn(2, 4, requires_grad=True)
    adv = torch.tensor([1.0, -1.0])
    out = grpo_loss(pol, pol.detach().clone(), torch.ones(2, 4), adv, 0.15, 0.01, HumanlineParams())
    assert out.loss.item() == pytest.approx(0.0, abs=1e-7)
    assert out.metrics["ratio/mean"] == 1.0 and out.metrics["kl"] == 0.0
    out.loss.backward()
    torch.testing.assert_close(pol.grad, -adv[:, None].expand(2, 4) / 8)


def test_grpo_truncated_importance_weight_against_the_sampler():
    """online.is_cap: each token's surrogate × min(exp(ref − behaviour), cap), detached; the KL
    term is not weighed. ref = 0, so the weight is min(exp(−behaviour), 1.5)."""
    pol, ref, mask, adv = _batch()
    behaviour = torch.tensor([[0.0, -1.0, 0.2], [0.3, 0.0, NAN]])
    # weights: [1, min(e, 1.5) = 1.5, e^-0.2], [e^-0.3, 1]; the masked token's is never read
    weights = [1.0, 1.5, math.exp(-0.2), math.exp(-0.3), 1.0]
    out = grpo_loss(pol, ref, mask, adv, EPS, beta_kl=0.1, behaviour=behaviour, is_cap=1.5)
    kls = [_k3(x) for x in (0.0, 0.5, math.log(0.5), 0.1, -0.5)]
    terms = zip(SURROGATE, weights, kls, strict=True)
    assert out.loss.item() == pytest.approx(sum(s * w + 0.1 * k for s, w, k in terms) / 5, abs=1e-6)
    assert out.metrics["is_weight/mean"] == pytest.approx(sum(weights) / 5, abs=1e-6)
    out.loss.backward()
    assert torch.isfinite(pol.grad).all()
    # the weight is a constant: an unclipped token's gradient is −ρ·A·w/N (+ the KL's)
    kl_grad = 0.1 * (1 - math.exp(-math.log(0.5))) / 5  # d k3 / d pol at log-ratio log 0.5
    assert pol.grad[0, 2].item() == pytest.approx(-0.5 * math.exp(-0.2) / 5 + kl_grad, abs=1e-6)
