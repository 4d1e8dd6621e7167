"""Two models judged on the same items → one line: which is better, by how much, how sure.

    v = paired_verdict(judgements_a, judgements_b, a="offline+humanline", b="offline")
    print(v.line())
    # offline+humanline vs offline: win rate 0.56 ± 0.04 vs 0.53 ± 0.04 (n=32), difference
    # +0.03 ± 0.05 (paired, p=0.55) — not significant at this size

Each model's judgements are (n_items, n_orders) model-win scores against the same reference
answers (reports.stats: 1 win, 0 loss, 0.5 tie; the item's score is the mean over the orders).
Both models saw the same items, so the difference is *paired*: d_i = score_a,i − score_b,i,
its mean ± sd(d)/√n (reports.stats.mean_se). Pairing removes the items' shared difficulty,
so its SE is at most what the two win rates' independent SEs give when the models agree on
the hard and easy items. The p-value is two-sided, normal approximation (as reports.stats
z_test); "significant" means p < alpha.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reports.stats import Estimate, item_scores, mean_se


@dataclass(frozen=True)
class Verdict:
    a: str
    b: str
    win_a: Estimate
    win_b: Estimate
    difference: Estimate  # paired, a − b
    p_value: float  # NaN with fewer than two items
    alpha: float = 0.05

    @property
    def significant(self) -> bool:
        return math.isfinite(self.p_value) and self.p_value < self.alpha

    def conclusion(self) -> str:
        if self.difference.n < 2:
            return "too few items to tell"
        if self.difference.value == 0 and self.difference.se == 0:
            return "judged alike on every item: no difference at this size"
        if not self.significant:
            return "not significant at this size"
        better = self.a if self.difference.value > 0 else self.b
        return f"{better} is better (significant at {self.alpha:g})"

    def line(self) -> str:
        d = self.difference
        p = f"p={self.p_value:.2g}" if math.isfinite(self.p_value) else "p=n/a"
        return (
            f"{self.a} vs {self.b}: win rate {self.win_a.value:.2f} ± {self.win_a.se:.2f} vs "
            f"{self.win_b.value:.2f} ± {self.win_b.se:.2f} (n={d.n}), difference "
            f"{d.value:+.2f} ± {d.se:.2f} (paired, {p}) — {self.conclusion()}"
        )


def _p_value(d: Estimate) -> float:
    if d.n < 2:
        return float("nan")
    if d.se == 0:  # every item moved by the same amount: certain if it moved at all
        return 1.0 if d.value == 0 else 0.0
    return math.erfc(abs(d.value) / d.se / math.sqrt(2))


def paired_verdict(
    judgements_a: np.ndarray | Sequence[Sequence[float]],
    judgements_b: np.ndarray | Sequence[Sequence[float]],
    *,
    a: str = "a",
    b: str = "b",
    alpha: float = 0.05,
) -> Verdict:
    """Compare two models' judgements on the same items, item i of one with item i of the
    other; ValueError when the item counts differ."""
    sa, sb = item_scores(judgements_a), item_scores(judgements_b)
    if sa.shape != sb.shape:
        raise ValueError(f"the two models were judged on {len(sa)} and {len(sb)} items")
    diff = mean_se(sa - sb)
    return Verdict(a, b, mean_se(sa), mean_se(sb), diff, _p_value(diff), alpha)


def judgements_from_items(items: Sequence[dict[str, Any]]) -> tuple[list[str], np.ndarray]:
    """(instructions, (n_items, n_orders) scores) from an instruction evaluation's per-item
    records (its report's `items`), in item order: what paired_verdict takes."""
    ordered = sorted(items, key=lambda it: int(it["index"]))
    scores = [[float(j["score"]) for j in it["judgements"]] for it in ordered]
    return [str(it["instruction"]) for it in ordered], np.asarray(scores, dtype=float)
