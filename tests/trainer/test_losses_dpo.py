"""DPO on two hand-computed pairs: −log σ(β (R_w − R_l)) with and without humanline."""

from __future__ import annotations

import math

import pytest
import torch

from contract.spec import DPOConfig, HumanlineParams
from trainer.losses import dpo_loss

NAN, INF = float("nan"), float("inf")


def _nll_sigmoid(x: float) -> float:
    """−log σ(x) written out, independent of torch."""
    return -math.log(1.0 / (1.0 + math.exp(-x)))


def _pairs():
    """Token log-ratios: chosen [[0.5, −1.0, ·], [0.5, 0.5, 0.5]] → R_w = [−0.5, 1.5];
    rejected [[−1.0, −2.0, 0.0], [2.0, ·, ·]] → R_l = [−3.0, 2.0]; · = garbage under the mask."""
    pol_w = torch.tensor([[-1.0, -2.0, NAN], [-0.5, -0.5, -0.5]], requires_grad=True)
    ref_w = torch.tensor([[-1.5, -1.0, INF], [-1.0, -1.0, -1.0]])
    m_w = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    pol_l = torch.tensor([[-2.0, -3.0, -1.0], [-1.0, -INF, 7.0]], requires_grad=True)
    ref_l = torch.tensor([[-1.0, -1.0, -1.0], [-3.0, NAN, -INF]])
    m_l = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    return pol_w, ref_w, m_w, pol_l, ref_l, m_l


def test_dpo_plain():
    out = dpo_loss(*_pairs(), DPOConfig(beta=0.1))
    expected = (_nll_sigmoid(0.1 * (-0.5 + 3.0)) + _nll_sigmoid(0.1 * (1.5 - 2.0))) / 2
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    m = out.metrics
    assert m["loss"] == pytest.approx(expected, abs=1e-6)
    assert m["rewards/chosen"] == pytest.approx(0.1 * (-0.5 + 1.5) / 2)
    assert m["rewards/rejected"] == pytest.approx(0.1 * (-3.0 + 2.0) / 2)
    assert m["rewards/margins"] == pytest.approx(0.1 * (2.5 - 0.5) / 2)
    assert m["rewards/accuracies"] == 0.5
    assert m["clamp_frac"] == 0.0
    assert m["logratio/mean"] == pytest.approx((1.0 - 3.0 + 2.0) / 9)
    # detached 0-d tensors, no graph: the loop sums them on the device, one host copy a step
    assert all(torch.is_tensor(v) and v.dim() == 0 and not v.requires_grad for v in m.values())
    assert out.floats() == {k: float(v) for k, v in m.items()}


def test_dpo_humanline_clamps_and_zeroes_clamped_gradients():
    pol_w, ref_w, m_w, pol_l, ref_l, m_l = _pairs()
    out = dpo_loss(pol_w, ref_w, m_w, pol_l, ref_l, m_l, DPOConfig(beta=0.1), HumanlineParams())
    # rejected −2.0 → −1.5 and 2.0 → 1.5: R_l = [−2.5, 1.5]; chosen all inside the range
    expected = (_nll_sigmoid(0.1 * (-0.5 + 2.5)) + _nll_sigmoid(0.1 * (1.5 - 1.5))) / 2
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    assert out.metrics["clamp_frac"] == pytest.approx(2 / 9)
    assert out.metrics["rewards/accuracies"] == 0.5  # the tied pair does not count as correct
    assert out.metrics["logratio/mean"] == pytest.approx((1.0 - 2.5 + 1.5) / 9)

    out.loss.backward()
    # d/dR_l of −log σ(β(R_w − R_l)) / B = β σ(−β(R_w − R_l)) / 2 on unclamped tokens
    g0 = 0.1 / (1 + math.exp(0.1 * 2.0)) / 2
    # clamped at [0, 1] and [1, 0], masked at [1, 1:]: exactly zero; the rest get g0
    expected_grad = torch.tensor([[g0, 0.0, g0], [0.0, 0.0, 0.0]])
    assert torch.equal(pol_l.grad == 0, expected_grad == 0)
    torch.testing.assert_close(pol_l.grad, expected_grad)
    assert torch.isfinite(pol_w.grad).all() and pol_w.grad[0, 2] == 0.0
    assert (pol_w.grad[m_w.bool()] < 0).all()  # every unclamped chosen token is pushed up


def test_dpo_length_normalised_counts_nonzero_tokens():
    out = dpo_loss(*_pairs(), DPOConfig(beta=0.1), length_normalize=True)
    r_w = [-0.5 / 2, 1.5 / 3]
    r_l = [-3.0 / 2, 2.0 / 1]  # row 0: three tokens but one exact-zero log-ratio
    expected = sum(_nll_sigmoid(0.1 * (w - lo)) for w, lo in zip(r_w, r_l, strict=True)) / 2
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)


def test_dpo_reference_free_ignores_the_reference():
    pol_w, ref_w, m_w, pol_l, ref_l, m_l = _pairs()
    out = dpo_loss(
        pol_w, ref_w * 100, m_w, pol_l, ref_l + 3, m_l, DPOConfig(beta=0.1, reference_free=True)
    )
    # R = Σ log π: R_w = [−3.0, −1.5], R_l = [−6.0, −1.0]
    expected = (_nll_sigmoid(0.1 * 3.0) + _nll_sigmoid(0.1 * -0.5)) / 2
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)


def test_dpo_first_step_is_log_two_with_gradient():
    pol = torch.randn(4, 5, requires_grad=True)
    ref = pol.detach().clone()
    mask = torch.ones(4, 5)
    out = dpo_loss(pol, ref, mask, pol, ref, mask, DPOConfig(), HumanlineParams())
    assert out.loss.item() == pytest.approx(math.log(2))
    assert out.metrics["clamp_frac"] == 0.0
    out.loss.backward()  # chosen and rejected are the same tensor here, so the gradients cancel
    assert torch.equal(pol.grad, torch.zeros(4, 5))
    pol_w = pol.detach().clone().requires_grad_()
    dpo_loss(pol_w, ref, mask, pol.detach(), ref, mask, DPOConfig()).loss.backward()
    assert (pol_w.grad < 0).all()  # lp_pol carries the gradient even where ratio == 1
