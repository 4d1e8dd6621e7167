"""Statistics of the evaluation reports: win rates, length-controlled win rates, pass@1.

numpy only (no torch, no scipy): the API's report pages import this module.

Units. Every estimate is a fraction in [0, 1] with its standard error; pages show percents.
The *item* (an instruction, a problem) is the sampling unit: the two judgements of one item
(both answer orders) and the n samples of one problem are correlated, so standard errors are
computed over items, never over judgements or samples.

Win rate. Each item is judged twice with the answer positions swapped; a judgement scores the
model 1 (its answer preferred), 0 (the reference preferred) or 0.5 (a tie, or an answer the
judge gave that could not be parsed). The item's score is the mean of its two judgements, the
win rate the mean over items, its SE the items' standard deviation / √n.

Length-controlled win rate (after Dubois et al. 2024, "Length-Controlled AlpacaEval"). A
logistic model of each judgement,

    logit P(model preferred) = θ + φ · tanh((len_model − len_ref) / σ_Δ)

with σ_Δ the standard deviation of the length differences over items (lengths in characters,
as AlpacaEval measures them). The length-controlled win rate is the predicted win probability
with the length term zeroed, averaged over items, i.e. σ(θ) here: "how often would the judge
prefer the model if its answers were as long as the reference's". AlpacaEval's GLM also has an
instruction-difficulty term γ_x fitted once across hundreds of models; with one model and one
reference per evaluation it is not identifiable, so the term is left out (`extra` covariates
can be passed for it). φ gets a weak L2 penalty (`l2`), as in AlpacaEval, which keeps the fit
finite when lengths perfectly separate the judgements. The SE is the delta method on a
cluster-robust (per item: the two orders of one item are correlated; ties make the Bernoulli
variance wrong anyway) sandwich covariance; `bootstrap_se` gives the same by resampling items
and the tests check the two agree.

pass@1. A problem's pass@1 is its fraction of correct samples (an unbiased estimate of the
probability one sample is correct); the score is the mean over problems, the SE the problems'
standard deviation / √N (this includes the within-problem sampling noise, which shrinks as n
grows).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TIE = 0.5


@dataclass(frozen=True)
class Estimate:
    """A mean over `n` items and its standard error."""

    value: float
    se: float
    n: int

    def ci95(self) -> tuple[float, float]:
        return (self.value - 1.96 * self.se, self.value + 1.96 * self.se)

    def as_dict(self) -> dict[str, float | int | list[float]]:
        lo, hi = self.ci95()
        return {"value": _finite(self.value), "se": _finite(self.se), "n": self.n, "ci95": [lo, hi]}


def _finite(x: float) -> float:
    return float(x) if math.isfinite(x) else float("nan")


def mean_se(values: Sequence[float] | np.ndarray) -> Estimate:
    """Mean ± standard deviation (ddof=1) / √n; the SE is 0 for one item, NaN for none."""
    v = np.asarray(values, dtype=float)
    n = int(v.size)
    if n == 0:
        return Estimate(float("nan"), float("nan"), 0)
    se = float(v.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    return Estimate(float(v.mean()), se, n)


# --- win rates ------------------------------------------------------------------------------


def item_scores(judgements: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    """(n_items, n_orders) model-win scores in {0, 0.5, 1} → each item's mean score."""
    j = np.asarray(judgements, dtype=float)
    if j.ndim == 1:
        j = j[:, None]
    if j.size and (np.nanmin(j) < 0 or np.nanmax(j) > 1):
        raise ValueError("judgements must be model-win scores in [0, 1]")
    return j.mean(axis=1)


def win_rate(judgements: np.ndarray | Sequence[Sequence[float]]) -> Estimate:
    """Win rate ± SE over items from (n_items, n_orders) judgements (ties = 0.5)."""
    return mean_se(item_scores(judgements))


@dataclass(frozen=True)
class LengthControlledFit:
    """The fitted GLM: coef = [θ (intercept), φ (length), *extra], its robust covariance."""

    coef: np.ndarray
    cov: np.ndarray
    length_scale: float
    iterations: int
    converged: bool
    estimate: Estimate
    names: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "coef": dict(zip(self.names, map(float, self.coef), strict=False)),
            "se": dict(
                zip(
                    self.names,
                    map(float, np.sqrt(np.clip(np.diag(self.cov), 0, None))),
                    strict=False,
                )
            ),
            "length_scale": self.length_scale,
            "iterations": self.iterations,
            "converged": self.converged,
        }


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free


def length_features(len_model: np.ndarray, len_ref: np.ndarray) -> tuple[np.ndarray, float]:
    """tanh(Δ / σ_Δ) per item, and σ_Δ (1 when every difference is equal)."""
    delta = np.asarray(len_model, dtype=float) - np.asarray(len_ref, dtype=float)
    scale = float(delta.std(ddof=1)) if delta.size > 1 else 0.0
    if not math.isfinite(scale) or scale <= 0:
        scale = 1.0
    return np.tanh(delta / scale), scale


def _fit_logistic(
    x: np.ndarray, y: np.ndarray, penalty: np.ndarray, max_iter: int = 100, tol: float = 1e-10
) -> tuple[np.ndarray, np.ndarray, int, bool]:
    """Penalised maximum likelihood of a logistic model with fractional targets, by Newton's
    method with step halving. Returns (coef, Hessian of the penalised -loglik, iters, ok)."""
    beta = np.zeros(x.shape[1])
    pen = np.diag(penalty)

    def objective(b: np.ndarray) -> float:
        z = x @ b
        # -sum[y log p + (1-y) log(1-p)] = sum[log(1+e^z) - y z]
        return float(np.sum(np.logaddexp(0.0, z) - y * z) + 0.5 * b @ pen @ b)

    current = objective(beta)
    hess = np.eye(x.shape[1])
    for it in range(1, max_iter + 1):
        p = _sigmoid(x @ beta)
        grad = x.T @ (p - y) + pen @ beta
        hess = (x * (p * (1 - p))[:, None]).T @ x + pen
        step = np.linalg.lstsq(hess, grad, rcond=None)[0]
        t = 1.0
        while True:
            candidate = beta - t * step
            value = objective(candidate)
            if value <= current + 1e-12 or t < 1e-8:
                break
            t *= 0.5
        beta, previous, current = candidate, current, value
        if abs(previous - current) < tol * (1 + abs(current)) and np.max(np.abs(t * step)) < 1e-8:
            p = _sigmoid(x @ beta)
            hess = (x * (p * (1 - p))[:, None]).T @ x + pen
            return beta, hess, it, True
    return beta, hess, max_iter, False


def length_controlled_win_rate(
    judgements: np.ndarray | Sequence[Sequence[float]],
    len_model: Sequence[float] | np.ndarray,
    len_ref: Sequence[float] | np.ndarray,
    *,
    l2: float = 0.1,
    extra: np.ndarray | None = None,
) -> LengthControlledFit:
    """Fit the length-controlled GLM on (n_items, n_orders) judgements; see the module doc.

    `extra` (n_items, k) adds covariates (e.g. an instruction-difficulty score) that, unlike
    the length term, are kept when predicting.
    """
    j = np.asarray(judgements, dtype=float)
    if j.ndim == 1:
        j = j[:, None]
    n_items, n_orders = j.shape
    if n_items == 0:
        nan = float("nan")
        return LengthControlledFit(
            np.full(2, nan),
            np.full((2, 2), nan),
            nan,
            0,
            False,
            Estimate(nan, nan, 0),
            ["intercept", "length"],
        )
    feat, scale = length_features(np.asarray(len_model), np.asarray(len_ref))
    cols = [np.ones(n_items), feat]
    names = ["intercept", "length"]
    if extra is not None:
        extra = np.asarray(extra, dtype=float).reshape(n_items, -1)
        cols.extend(extra.T)
        names.extend(f"extra_{i}" for i in range(extra.shape[1]))
    x_item = np.stack(cols, axis=1)  # (n_items, p)
    x = np.repeat(x_item, n_orders, axis=0)  # row (i, o) → item i
    y = j.reshape(-1)
    penalty = np.zeros(x.shape[1])
    penalty[1] = l2
    beta, hess, iters, ok = _fit_logistic(x, y, penalty)

    # Cluster-robust sandwich: per-item score contributions, summed over the item's orders.
    resid = (y - _sigmoid(x @ beta)).reshape(n_items, n_orders).sum(axis=1)
    scores = x_item * resid[:, None]
    meat = scores.T @ scores * (n_items / max(n_items - 1, 1))
    bread = np.linalg.pinv(hess)
    cov = bread @ meat @ bread

    x0 = x_item.copy()
    x0[:, 1] = 0.0  # the length term zeroed
    p0 = _sigmoid(x0 @ beta)
    grad = ((p0 * (1 - p0))[:, None] * x0).mean(axis=0)
    se = float(math.sqrt(max(grad @ cov @ grad, 0.0)))
    return LengthControlledFit(
        beta, cov, scale, iters, ok, Estimate(float(p0.mean()), se, n_items), names
    )


# --- math -------------------------------------------------------------------------------------


def pass_at_1(correct: Sequence[Sequence[bool | float]] | np.ndarray) -> Estimate:
    """Mean over problems of the fraction of correct samples, ± SE over problems. Rows may
    have different numbers of samples."""
    if isinstance(correct, np.ndarray) and correct.ndim == 2:
        return mean_se(correct.astype(float).mean(axis=1))
    per_problem = [float(np.mean(np.asarray(row, dtype=float))) for row in correct if len(row)]
    return mean_se(per_problem)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with c correct out of n samples (Chen et al. 2021)."""
    if k > n:
        raise ValueError(f"k={k} > n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# --- resampling and comparisons ------------------------------------------------------------


def bootstrap_se(
    statistic: Callable[[np.ndarray], float],
    n_items: int,
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> float:
    """SE of `statistic(indices)` when items are resampled with replacement."""
    rng = np.random.default_rng(seed)
    values = [statistic(rng.integers(0, n_items, n_items)) for _ in range(n_boot)]
    return float(np.std(values, ddof=1))


def z_test(a: Estimate, b: Estimate) -> float:
    """Two-sided p-value of a − b = 0 for independent estimates (normal approximation)."""
    se = math.hypot(a.se, b.se)
    if not se or not math.isfinite(se):
        return float("nan")
    z = abs(a.value - b.value) / se
    return math.erfc(z / math.sqrt(2))


def holm_bonferroni(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order (NaNs stay NaN)."""
    idx = [i for i, p in enumerate(p_values) if math.isfinite(p)]
    m = len(idx)
    adjusted = [float("nan")] * len(p_values)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def metric_estimate(ev: dict[str, Any], metric: str) -> Estimate | None:
    """`metric` from an evaluation summary's metrics ({"value", "se", "n"} or a bare
    number, SE unknown), or None when it does not report it."""
    value = (ev.get("metrics") or {}).get(metric)
    if isinstance(value, dict) and value.get("value") is not None:
        return Estimate(
            float(value["value"]), float(value.get("se") or 0.0), int(value.get("n") or 0)
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Estimate(
            float(value), float("nan"), int((ev.get("metrics") or {}).get("n_items") or 0)
        )
    return None


def pick_evaluation(
    evals: list[dict[str, Any]], metric: str, file_id: str | None = None
) -> dict[str, Any] | None:
    ok = [
        e
        for e in evals
        if e.get("status") == "succeeded"
        and metric_estimate(e, metric) is not None
        and (file_id is None or e.get("file_id") == file_id)
    ]
    if not ok:
        return None
    # final model first, then the latest step; newest evaluation breaks ties
    return max(
        ok,
        key=lambda e: (
            e.get("step") is None,
            e.get("step") or 0,
            str(e.get("created_at") or ""),
            e.get("id", ""),
        ),
    )


def finite_number(v: Any) -> float | None:
    """A finite int or float as a float; None for anything else (bools, NaN, strings)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
        return float(v)
    return None
