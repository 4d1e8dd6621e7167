"""Win rate, length-controlled win rate and pass@1: synthetic judges with known behaviour,
standard errors against the bootstrap, hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from reports.stats import (
    Estimate,
    bootstrap_se,
    holm_bonferroni,
    item_scores,
    length_controlled_win_rate,
    length_features,
    mean_se,
    pass_at_1,
    pass_at_k,
    win_rate,
    z_test,
)


def _lengths(rng: np.random.Generator, n: int, longer: float) -> tuple[np.ndarray, np.ndarray]:
    """Reference lengths, and model lengths `longer` log-units longer on average."""
    ref = rng.normal(800, 200, n).clip(50)
    model = ref * rng.lognormal(longer, 0.4, n)
    return model, ref


def _judge(rng: np.random.Generator, p_win: np.ndarray) -> np.ndarray:
    """Both orders judged independently with the model winning with probability p_win."""
    return (rng.random((p_win.size, 2)) < p_win[:, None]).astype(float)


def _length_biased(seed: int, n: int, longer: float, quality: float, slope: float):
    """n judged pairs, model answers `longer` (as _lengths), from a judge whose logit that the
    model wins is `quality` + `slope` x the length feature: (judgements, model, ref)."""
    rng = np.random.default_rng(seed)
    model, ref = _lengths(rng, n, longer)
    feat, _ = length_features(model, ref)
    return _judge(rng, 1 / (1 + np.exp(-(quality + slope * feat)))), model, ref


def test_length_only_judge_gives_lc_near_half_while_raw_is_far_from_it():
    # The judge looks only at length: P(model wins) = σ(3 · tanh(Δ/σ)), and the model writes
    # longer answers 80% of the time. Quality is equal, so the honest answer is 50%.
    judgements, model, ref = _length_biased(0, 2000, longer=0.35, quality=0.0, slope=3.0)
    raw = win_rate(judgements)
    lc = length_controlled_win_rate(judgements, model, ref)
    assert raw.value > 0.68, raw  # the length bias inflates the raw win rate ...
    assert abs(lc.estimate.value - 0.5) < 3 * lc.estimate.se, lc.estimate  # ... not LC
    assert abs(raw.value - 0.5) > 5 * raw.se
    assert lc.coef[1] > 2.0 and lc.converged  # it found the length term


def test_length_only_judge_preferring_shorter_answers_is_corrected_too():
    # prefers the shorter answer
    judgements, model, ref = _length_biased(1, 2000, longer=0.35, quality=0.0, slope=-2.0)
    assert win_rate(judgements).value < 0.35
    lc = length_controlled_win_rate(judgements, model, ref)
    assert abs(lc.estimate.value - 0.5) < 3 * lc.estimate.se


def test_unbiased_judge_lc_and_raw_agree():
    # A better model (70% wins) and a judge that ignores length: both estimates find 70%.
    rng = np.random.default_rng(2)
    model, ref = _lengths(rng, 800, longer=0.0)  # lengths vary, both directions
    judgements = _judge(rng, np.full(800, 0.7))
    raw = win_rate(judgements)
    lc = length_controlled_win_rate(judgements, model, ref).estimate
    assert abs(raw.value - 0.7) < 3 * raw.se
    assert abs(lc.value - raw.value) < 0.02
    assert abs(lc.value - 0.7) < 3 * lc.se


def test_quality_and_length_bias_together_recover_the_quality_effect():
    # True logit 1.0 (σ = 73%) plus a length bias; LC recovers ≈ 73%, raw overshoots.
    judgements, model, ref = _length_biased(3, 1000, longer=0.4, quality=1.0, slope=2.0)
    lc = length_controlled_win_rate(judgements, model, ref).estimate
    assert abs(lc.value - 1 / (1 + math.exp(-1.0))) < 2.5 * lc.se
    assert win_rate(judgements).value > lc.value + 0.08


def test_win_rate_se_matches_the_bootstrap():
    rng = np.random.default_rng(4)
    judgements = _judge(rng, rng.uniform(0.2, 0.9, 300))
    judgements[::7, 1] = 0.5  # some ties
    est = win_rate(judgements)
    boot = bootstrap_se(lambda idx: win_rate(judgements[idx]).value, 300, n_boot=2000, seed=1)
    assert est.se == pytest.approx(boot, rel=0.1)


def test_lc_se_matches_the_bootstrap():
    judgements, model, ref = _length_biased(5, 300, longer=0.3, quality=0.3, slope=2.0)
    est = length_controlled_win_rate(judgements, model, ref).estimate
    boot = bootstrap_se(
        lambda idx: (
            length_controlled_win_rate(judgements[idx], model[idx], ref[idx]).estimate.value
        ),
        300,
        n_boot=400,
        seed=2,
    )
    assert est.se == pytest.approx(boot, rel=0.15)


def test_item_scores_average_both_orders_with_ties_as_half():
    judgements = [[1, 1], [1, 0], [0, 0], [0.5, 1], [0.5, 0.5]]
    assert item_scores(judgements).tolist() == [1.0, 0.5, 0.0, 0.75, 0.5]
    est = win_rate(judgements)
    assert est.value == pytest.approx(0.55)
    assert est.se == pytest.approx(np.std([1, 0.5, 0, 0.75, 0.5], ddof=1) / math.sqrt(5))
    with pytest.raises(ValueError):
        win_rate([[2, 0]])


def test_equal_lengths_reduce_lc_to_the_raw_win_rate():
    # No length variation → the length feature is 0 everywhere and σ(θ) is the mean.
    judgements = np.array([[1, 1], [1, 0], [0, 0], [1, 1], [0.5, 1]], dtype=float)
    lc = length_controlled_win_rate(judgements, [100] * 5, [100] * 5)
    assert lc.estimate.value == pytest.approx(judgements.mean(), abs=1e-8)


def test_the_fit_is_the_penalised_maximum_likelihood():
    rng = np.random.default_rng(6)
    model, ref = _lengths(rng, 200, longer=0.2)
    feat, _ = length_features(model, ref)
    judgements = _judge(rng, 1 / (1 + np.exp(-(0.5 + 1.5 * feat))))
    fit = length_controlled_win_rate(judgements, model, ref, l2=1.0)
    x = np.repeat(np.stack([np.ones(200), feat], 1), 2, axis=0)
    p = 1 / (1 + np.exp(-x @ fit.coef))
    grad = x.T @ (judgements.reshape(-1) - p) - np.array([0.0, 1.0 * fit.coef[1]])
    assert np.abs(grad).max() < 1e-6  # stationary point of the penalised log-likelihood


def test_perfect_separation_stays_finite():
    # The judge always picks the longer answer: the MLE is infinite, the penalty keeps it sane.
    rng = np.random.default_rng(7)
    model, ref = _lengths(rng, 100, longer=0.3)
    judgements = np.repeat((model > ref).astype(float)[:, None], 2, axis=1)
    lc = length_controlled_win_rate(judgements, model, ref)
    assert np.isfinite(lc.coef).all() and np.isfinite(lc.estimate.se)
    assert 0.2 < lc.estimate.value < 0.8


def test_pass_at_1_mean_over_samples_and_its_se():
    correct = [[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]]
    est = pass_at_1(correct)
    per = [1.0, 0.25, 0.0, 0.5]
    assert est.value == pytest.approx(np.mean(per))
    assert est.se == pytest.approx(np.std(per, ddof=1) / 2)
    assert pass_at_1([[True], [False, True]]).value == pytest.approx(0.75)  # ragged rows


def test_pass_at_1_se_matches_the_bootstrap():
    rng = np.random.default_rng(8)
    difficulty = rng.uniform(0, 1, 400)
    correct = rng.random((400, 8)) < difficulty[:, None]
    est = pass_at_1(correct)
    boot = bootstrap_se(lambda idx: pass_at_1(correct[idx]).value, 400, n_boot=2000, seed=3)
    assert est.se == pytest.approx(boot, rel=0.1)


def test_pass_at_k_is_the_unbiased_estimator():
    # Brute force: the chance that k of n samples drawn without replacement include a correct one.
    from itertools import combinations

    n, c = 6, 2
    samples = [1] * c + [0] * (n - c)
    for k in (1, 2, 3, 5):
        subsets = list(combinations(samples, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 3, 2) == 1.0


def test_small_helpers():
    assert math.isnan(mean_se([]).value) and mean_se([0.3]).se == 0.0
    p = z_test(Estimate(0.6, 0.02, 100), Estimate(0.5, 0.02, 100))
    assert p == pytest.approx(math.erfc((0.1 / math.hypot(0.02, 0.02)) / math.sqrt(2)))
    assert holm_bonferroni([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(holm_bonferroni([float("nan"), 0.02])[0])
