"""The demo's verdict: two models' judgements on the same items → one line, by hand."""

from __future__ import annotations

import math

import pytest

from reports.verdict import judgements_from_items, paired_verdict

# Four items, both answer orders judged (1 model wins, 0 reference wins, 0.5 tie).
A = [[1, 1], [1, 0], [0.5, 0.5], [0, 0]]  # item scores 1, .5, .5, 0   → mean .5
B = [[1, 0], [0, 0], [0.5, 0.5], [0, 0]]  # item scores .5, 0, .5, 0   → mean .25
# d = .5, .5, 0, 0: mean .25, sd = sqrt(.25/3) = .288675, SE = .144338, z = √3,
# p = erfc(√3/√2) = 0.0832645. Win rates: .5 ± sqrt(.5/3)/2 = .204124, .25 ± .144338.


def test_the_verdict_by_hand():
    v = paired_verdict(A, B, a="humanline", b="offline")
    assert v.win_a.value == 0.5 and v.win_a.se == pytest.approx(0.2041241, abs=1e-7)
    assert v.win_b.value == 0.25 and v.win_b.se == pytest.approx(0.1443376, abs=1e-7)
    assert v.difference.value == 0.25 and v.difference.n == 4
    assert v.difference.se == pytest.approx(0.1443376, abs=1e-7)
    assert v.p_value == pytest.approx(0.0832645, abs=1e-6)
    # pairing: tighter than the two win rates' independent SEs, sqrt(.2041² + .1443²) = .25
    assert v.difference.se < math.hypot(v.win_a.se, v.win_b.se) == pytest.approx(0.25)
    assert not v.significant
    assert v.line() == (
        "humanline vs offline: win rate 0.50 ± 0.20 vs 0.25 ± 0.14 (n=4), "
        "difference +0.25 ± 0.14 (paired, p=0.083) — not significant at this size"
    )


def test_a_significant_difference_names_the_better_model():
    assert paired_verdict(A, B, a="humanline", b="offline", alpha=0.1).conclusion() == (
        "humanline is better (significant at 0.1)"
    )
    v = paired_verdict(B, A, a="humanline", b="offline", alpha=0.1)
    assert v.difference.value == -0.25 and v.conclusion().startswith("offline is better")
    assert "difference -0.25 ± 0.14" in v.line()


def test_degenerate_cases():
    same = paired_verdict(A, A)  # identical judgements: no difference, certainly
    assert (same.difference.value, same.difference.se, same.p_value) == (0.0, 0.0, 1.0)
    assert same.conclusion() == "judged alike on every item: no difference at this size"
    shifted = paired_verdict([[1, 1], [1, 1]], [[0, 0], [0, 0]])  # every item moved by 1
    assert shifted.p_value == 0.0 and shifted.significant
    one = paired_verdict([[1, 1]], [[0, 0]])
    assert math.isnan(one.p_value) and one.conclusion() == "too few items to tell"
    assert "p=n/a" in one.line()
    with pytest.raises(ValueError, match="4 and 3 items"):
        paired_verdict(A, B[:3])


def test_judgements_from_an_evaluation_reports_items_in_item_order():
    items = [
        {"index": i, "instruction": f"q{i}", "judgements": [{"score": s} for s in scores]}
        for i, scores in enumerate(A)
    ]
    instructions, judgements = judgements_from_items(list(reversed(items)))
    assert instructions == ["q0", "q1", "q2", "q3"]
    assert judgements.tolist() == A
