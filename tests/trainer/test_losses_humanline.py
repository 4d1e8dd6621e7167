"""Humanline clipping and sampling on hand-sized tensors (DESIGN.md §2, paper §4 and App. B)."""

from __future__ import annotations

import math

import pytest
import torch

from contract.spec import DPOConfig, HumanlineParams
from trainer.losses import dpo_loss, sequence_rewards, token_log_ratios

NAN, INF = float("nan"), float("inf")


def _leaf(rows):
    return torch.tensor(rows, dtype=torch.float32, requires_grad=True)


# ---- no humanline --------------------------------------------------------------------------


def test_raw_log_ratios_ignore_garbage_under_the_mask():
    pol = _leaf([[-1.0, -2.0, NAN], [-0.5, INF, -INF]])
    ref = torch.tensor([[-1.5, -1.0, INF], [-1.0, INF, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])

    r, rejected = token_log_ratios(pol, ref, mask, None)
    assert torch.equal(r, torch.tensor([[0.5, -1.0, 0.0], [0.5, 0.0, 0.0]]))
    assert not rejected.any()

    r.sum().backward()
    assert torch.equal(pol.grad, mask)  # 1 on completion tokens, exactly 0 (not NaN) on garbage


def test_bool_and_float_masks_agree():
    pol, ref = torch.randn(3, 4), torch.randn(3, 4)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    hp = HumanlineParams(log_eps_P=-0.3, log_eps_R=0.3)
    a = token_log_ratios(pol, ref, mask.bool(), hp)
    b = token_log_ratios(pol, ref, mask.float(), hp)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ---- clip ----------------------------------------------------------------------------------


def test_clip_clamps_in_log_space_and_zeroes_clamped_gradients():
    # raw log-ratios: inside, above, below, exactly on each bound, garbage under the mask
    pol = _leaf([[0.5, 2.0, -3.0, 1.5, -1.5, NAN]])
    ref = torch.zeros(1, 6)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])

    r, rejected = token_log_ratios(pol, ref, mask, HumanlineParams())
    assert torch.equal(r, torch.tensor([[0.5, 1.5, -1.5, 1.5, -1.5, 0.0]]))
    assert rejected.tolist() == [[False, True, True, False, False, False]]

    r.sum().backward()
    assert torch.equal(pol.grad, torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0, 0.0]]))


def test_clip_range_is_asymmetric_and_keeps_padding_at_zero():
    hp = HumanlineParams(log_eps_P=0.1, log_eps_R=1.0)  # a range that excludes 0
    pol = torch.tensor([[0.0, 0.5, 2.0, 7.0]])
    r, rejected = token_log_ratios(pol, torch.zeros(1, 4), torch.tensor([[1, 1, 1, 0]]), hp)
    assert torch.equal(r, torch.tensor([[0.1, 0.5, 1.0, 0.0]]))
    assert rejected.tolist() == [[True, False, True, False]]


def test_sequence_rewards_sum_and_length_normalise_by_nonzero_tokens():
    r = torch.tensor([[1.0, 0.0, 2.0, 9.0], [0.0, 0.0, 5.0, 5.0], [-1.0, -2.0, -3.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    assert torch.equal(sequence_rewards(r, mask), torch.tensor([3.0, 0.0, -6.0]))
    # row 0: the exact-zero token is not counted (paper's get_sequence_rewards): 3/2, not 3/3;
    # row 1: nothing non-zero, so 0 rather than 0/0
    assert torch.equal(sequence_rewards(r, mask, True), torch.tensor([1.5, 0.0, -2.0]))


# ---- sample --------------------------------------------------------------------------------


def _spread(n: int = 4096, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ref = -3 * torch.rand(4, n, generator=g)
    pol = ref + 1.5 * torch.randn(4, n, generator=g)
    mask = (torch.rand(4, n, generator=g) < 0.9).float()
    return pol, ref, mask


def test_sample_is_deterministic_given_the_generator_and_leaves_global_rng_alone():
    pol, ref, mask = _spread()
    hp = HumanlineParams(mode="sample")
    state = torch.get_rng_state()
    a = token_log_ratios(pol, ref, mask, hp, torch.Generator().manual_seed(7))
    b = token_log_ratios(pol, ref, mask, hp, torch.Generator().manual_seed(7))
    c = token_log_ratios(pol, ref, mask, hp, torch.Generator().manual_seed(8))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])
    assert 0.05 < a[1].float().mean() < 0.95 and not (a[1] & ~mask.bool()).any()


def test_sample_detaches_rejected_tokens_but_keeps_their_value():
    pol, ref, mask = _spread(512)
    pol.requires_grad_()
    r, rejected = token_log_ratios(
        pol, ref, mask, HumanlineParams(mode="sample"), torch.Generator()
    )
    assert torch.equal(r, torch.where(mask.bool(), pol - ref, 0.0).detach())
    r.sum().backward()
    assert rejected.any() and (mask.bool() & ~rejected).any()
    assert torch.equal(pol.grad[rejected], torch.zeros(int(rejected.sum())))
    assert torch.equal(pol.grad, (mask.bool() & ~rejected).float())


def _limit_params(log_eps_P: float, log_eps_R: float, M_P: float, M_R: float, k: float) -> dict:
    """The paper's clipping-theorem construction: Beta means ε_P/M_P, 1/(ε_R M_R); var O(1/k)."""
    p, q = math.exp(log_eps_P) / M_P, 1.0 / (math.exp(log_eps_R) * M_R)
    return {
        "log_eps_P": log_eps_P, "log_eps_R": log_eps_R, "M_P": M_P, "M_R": M_R,
        "gamma_P": k * p, "beta_P": k * (1 - p), "gamma_R": k * q, "beta_R": k * (1 - q),
    }  # fmt: skip


@pytest.mark.parametrize(("M_P", "M_R"), [(1.0, 1.0), (2.0, 3.0)])
def test_sample_recovers_clip_in_the_beta_limit(M_P, M_R):
    """As k → ∞, sampling rejects what clip clamps and the gradients coincide exactly."""
    hp_sample = HumanlineParams(mode="sample", **_limit_params(-1.5, 1.5, M_P, M_R, k=1e7))
    hp_clip = HumanlineParams(log_eps_P=-1.5, log_eps_R=1.5)
    pol, ref, mask = _spread()
    near_bound = ((pol - ref).abs() - 1.5).abs() < 0.02  # Beta std ~3e-4 around the bound
    mask = mask * ~near_bound

    pol_s, pol_c = pol.clone().requires_grad_(), pol.clone().requires_grad_()
    r_s, rej_s = token_log_ratios(pol_s, ref, mask, hp_sample, torch.Generator().manual_seed(0))
    r_c, rej_c = token_log_ratios(pol_c, ref, mask, hp_clip)
    assert torch.equal(rej_s, rej_c) and 0.1 < rej_c.float().mean() < 0.9
    r_s.sum().backward()
    r_c.sum().backward()
    assert torch.equal(pol_s.grad, pol_c.grad)


@pytest.mark.parametrize("gamma", [0.5, 0.8])
def test_sample_rejection_rate_matches_the_beta_cdf(gamma):
    """With B ~ Beta(γ, 1) and M_P = 1, P(reject | ratio ρ < 1) = P(B > ρ) = 1 − ρ^γ.

    M_R is tiny so the second criterion (π_ref/π < M_R·B_R) never fires for these ratios.
    """
    hp = HumanlineParams(mode="sample", M_P=1.0, gamma_P=gamma, beta_P=1.0, M_R=1e-6)
    rho = torch.tensor([0.25, 0.5, 0.81, 1.0, 2.0])
    n = 20_000
    lp = rho.log().repeat(n, 1)
    _, rejected = token_log_ratios(lp, torch.zeros_like(lp), torch.ones_like(lp), hp,
                                   torch.Generator().manual_seed(123))  # fmt: skip
    observed = rejected.float().mean(0)
    expected = 1 - rho.clamp(max=1.0) ** gamma
    torch.testing.assert_close(observed, expected, atol=0.015, rtol=0)  # ~4 std errors


def test_sample_mode_losses_are_reproducible():
    pol, ref, mask = _spread(64)
    hp = HumanlineParams(mode="sample", gamma_P=0.5, gamma_R=0.5)
    cfg = DPOConfig()
    run = [
        dpo_loss(
            pol[:2],
            ref[:2],
            mask[:2],
            pol[2:],
            ref[2:],
            mask[2:],
            cfg,
            hp,
            generator=torch.Generator().manual_seed(3),
        )
        for _ in range(2)
    ]
    assert torch.equal(run[0].loss, run[1].loss) and run[0].metrics == run[1].metrics
    assert 0 < run[0].metrics["clamp_frac"] < 1
