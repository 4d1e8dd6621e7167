"""KTO on three hand-computed examples: z0 from mismatched pairs, λ_D / λ_U weighting."""

from __future__ import annotations

import math

import pytest
import torch

from contract.spec import HumanlineParams, KTOConfig
from trainer.losses import kto_loss

NAN = float("nan")
CFG = KTOConfig()  # β 0.25, λ_D 1.1, λ_U 1.0 (the paper's)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _expected(rewards: list[float], labels: list[bool], z0: float, cfg: KTOConfig = CFG) -> float:
    per = [
        cfg.lambda_d * (1 - _sigmoid(cfg.beta * (r - z0)))
        if d
        else cfg.lambda_u * (1 - _sigmoid(cfg.beta * (z0 - r)))
        for r, d in zip(rewards, labels, strict=True)
    ]
    return sum(per) / len(per)


LABELS = [True, False, True]


def _batch(kl_shift: float = 0.0):
    """Token log-ratios (ref = 0, · = garbage under the mask):
    examples [[0.5, 1.0, ·], [−2.0, 0.5, 0.5], [3.0, ·, ·]] → R = [1.5, −1.0, 3.0];
    mismatched [[0.2, 0.4, ·], [2.5, ·, ·], [−0.3, 0.1, ·]] → R_kl = [0.6, 2.5, −0.2] (+ shift)."""
    pol = torch.tensor([[0.5, 1.0, NAN], [-2.0, 0.5, 0.5], [3.0, NAN, NAN]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    kl_pol = torch.tensor([[0.2, 0.4, NAN], [2.5, NAN, NAN], [-0.3, 0.1, NAN]])
    kl_pol = (kl_pol + torch.tensor([[kl_shift, 0, 0]] * 3)).requires_grad_()
    kl_mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0]])
    zeros = torch.zeros(3, 3)
    return pol, zeros, mask, torch.tensor(LABELS), kl_pol, zeros, kl_mask


def test_kto_plain():
    out = kto_loss(*_batch(), CFG)
    z0 = (0.6 + 2.5 - 0.2) / 3
    assert out.loss.item() == pytest.approx(_expected([1.5, -1.0, 3.0], LABELS, z0), abs=1e-6)
    m = out.metrics
    assert m["kl"] == pytest.approx(z0)
    assert m["rewards/chosen"] == pytest.approx(0.25 * (1.5 + 3.0) / 2)
    assert m["rewards/rejected"] == pytest.approx(0.25 * -1.0)
    assert (m["count/desirable"], m["count/undesirable"], m["clamp_frac"]) == (2.0, 1.0, 0.0)


def test_kto_z0_is_clamped_at_zero():
    out = kto_loss(*_batch(kl_shift=-2.0), CFG)  # R_kl = [−1.4, 0.5, −2.2]: mean < 0
    assert out.metrics["kl"] == 0.0
    assert out.loss.item() == pytest.approx(_expected([1.5, -1.0, 3.0], LABELS, 0.0), abs=1e-6)


def test_kto_humanline_clamps_rewards_and_the_kl_rewards():
    pol, ref, mask, labels, kl_pol, kl_ref, kl_mask = _batch()
    out = kto_loss(pol, ref, mask, labels, kl_pol, kl_ref, kl_mask, CFG, HumanlineParams())
    # R: −2.0 → −1.5, 3.0 → 1.5; R_kl: 2.5 → 1.5, so z0 = (0.6 + 1.5 − 0.2) / 3, not 2.9 / 3
    z0 = (0.6 + 1.5 - 0.2) / 3
    assert out.metrics["kl"] == pytest.approx(z0)
    assert out.loss.item() == pytest.approx(_expected([1.5, -0.5, 1.5], LABELS, z0), abs=1e-6)
    assert out.metrics["clamp_frac"] == pytest.approx(2 / 6)

    out.loss.backward()
    assert kl_pol.grad is None  # z0 is a detached reference point
    clamped_or_masked = torch.tensor([[0, 0, 1], [1, 0, 0], [1, 1, 1]]).bool()
    assert torch.equal(pol.grad[clamped_or_masked], torch.zeros(5))
    assert (pol.grad[0, :2] < 0).all() and (pol.grad[1, 1:] > 0).all()  # up for D, down for U
    # the desirable token's gradient by hand: −λ_D β σ'(β(R − z0)) / B
    s = _sigmoid(0.25 * (1.5 - z0))
    assert pol.grad[0, 0].item() == pytest.approx(-1.1 * 0.25 * s * (1 - s) / 3, rel=1e-5)


def test_kto_length_normalised_rewards_and_kl_rewards():
    out = kto_loss(*_batch(), CFG, length_normalize=True)
    z0 = (0.6 / 2 + 2.5 / 1 - 0.2 / 2) / 3
    rewards = [1.5 / 2, -1.0 / 3, 3.0 / 1]
    assert out.metrics["kl"] == pytest.approx(z0)
    assert out.loss.item() == pytest.approx(_expected(rewards, LABELS, z0), abs=1e-6)


def test_kto_kl_reduce_averages_the_gathered_rewards():
    calls = []

    def all_gather(local: torch.Tensor) -> torch.Tensor:
        calls.append(local.clone())
        return torch.cat([local, torch.tensor([-4.0, -2.3])])  # another rank's R_kl

    out = kto_loss(*_batch(), CFG, kl_reduce=all_gather)
    torch.testing.assert_close(calls[0], torch.tensor([0.6, 2.5, -0.2]))
    assert out.metrics["kl"] == 0.0  # the gathered mean (2.9 − 6.3) / 5 is negative
    z0 = (2.9 + 6.0) / 5
    out = kto_loss(*_batch(), CFG, kl_reduce=lambda x: torch.cat([x, torch.tensor([3.0, 3.0])]))
    assert out.metrics["kl"] == pytest.approx(z0)
    assert out.loss.item() == pytest.approx(_expected([1.5, -1.0, 3.0], LABELS, z0), abs=1e-6)


def test_kto_weights_and_one_sided_batches():
    pol, ref, mask, _, kl_pol, kl_ref, kl_mask = _batch()
    cfg = KTOConfig(beta=0.5, lambda_d=2.0, lambda_u=0.5)
    all_d = torch.tensor([True, True, True])
    out = kto_loss(pol, ref, mask, all_d, kl_pol, kl_ref, kl_mask, cfg)
    z0 = 2.9 / 3
    assert out.loss.item() == pytest.approx(
        _expected([1.5, -1.0, 3.0], [True] * 3, z0, cfg), abs=1e-6
    )
    assert "rewards/rejected" not in out.metrics and out.metrics["count/undesirable"] == 0.0
    all_u = ~all_d
    out = kto_loss(pol, ref, mask, all_u, kl_pol, kl_ref, kl_mask, cfg)
    assert out.loss.item() == pytest.approx(
        _expected([1.5, -1.0, 3.0], [False] * 3, z0, cfg), abs=1e-6
    )
    assert "rewards/chosen" not in out.metrics
