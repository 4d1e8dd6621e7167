"""Pair builder (paper, Algorithm 1) on hand-made scores."""

from types import SimpleNamespace

import pytest

from trainer.online import (
    Scored,
    attach_scores,
    dpo_pairs,
    group_by_prompt,
    grpo_groups,
    kto_examples,
)


def group(prompt: int, *scores: float) -> list[Scored]:
    return [Scored(prompt, f"p{prompt}c{i}", (prompt, i), s) for i, s in enumerate(scores)]


def texts(pairs) -> list[tuple[str, str]]:
    return [(p.chosen.text, p.rejected.text) for p in pairs]


def test_best_and_worst_of_each_prompt():
    pairs = dpo_pairs([group(0, 0.2, 0.9, -0.5, 0.1), group(1, 3.0, 1.0)])
    assert texts(pairs) == [("p0c1", "p0c2"), ("p1c0", "p1c1")]
    assert [p.prompt_index for p in pairs] == [0, 1]
    assert pairs[0].margin == pytest.approx(1.4)
    assert pairs[0].chosen.token_ids == (0, 1)


def test_tau_filter_keeps_spread_at_least_tau():
    groups = [group(0, 0.5, 0.505), group(1, 0.5, 0.51), group(2, 0.5, 0.52)]
    # 0.51 - 0.5 is 0.010000000000000009 in floats: kept; 0.005 is not.
    assert [p.prompt_index for p in dpo_pairs(groups)] == [1, 2]
    assert [p.prompt_index for p in dpo_pairs(groups, tau=0.02)] == [2]
    assert [p.prompt_index for p in dpo_pairs(groups, tau=0.0)] == [0, 1, 2]


def test_ties_first_max_and_last_min():
    pairs = dpo_pairs([group(0, 1.0, 0.0, 1.0, 0.0, 0.5)])
    assert texts(pairs) == [("p0c0", "p0c3")]


def test_all_equal_group_dropped_unless_tau_zero():
    equal = [group(0, 0.7, 0.7, 0.7)]
    assert dpo_pairs(equal) == []
    assert grpo_groups(equal) == []
    (pair,) = dpo_pairs(equal, tau=0.0)  # still two *distinct* completions
    assert (pair.chosen.text, pair.rejected.text) == ("p0c0", "p0c2")


def test_single_completion_never_pairs():
    assert dpo_pairs([group(0, 1.0)], tau=0.0) == []
    assert grpo_groups([group(0, 1.0)], tau=0.0) == []
    assert dpo_pairs([[]], tau=0.0) == []


def test_kto_splits_pairs_into_desirable_and_undesirable():
    examples = kto_examples(dpo_pairs([group(0, 0.0, 1.0), group(1, 2.0, 0.0, 1.0)]))
    assert [(e.prompt_index, e.completion.text, e.desirable) for e in examples] == [
        (0, "p0c1", True),
        (0, "p0c0", False),
        (1, "p1c0", True),
        (1, "p1c1", False),
    ]


def test_grpo_keeps_whole_groups_with_raw_scores():
    groups = grpo_groups([group(0, 0.0, 8.0, 1.0), group(1, 2.0, 2.0), group(2, 1.0, 10.0)])
    assert [g.prompt_index for g in groups] == [0, 2]
    assert groups[0].scores == [0.0, 8.0, 1.0]
    assert [c.text for c in groups[0].completions] == ["p0c0", "p0c1", "p0c2"]


def test_grpo_extremes_is_the_dpo_pair_with_raw_scores():
    (g,) = grpo_groups([group(0, 0.3, 9.0, -2.0, 1.0)], keep="extremes")
    assert g.scores == [9.0, -2.0]
    assert [c.text for c in g.completions] == ["p0c1", "p0c2"]


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="tau"):
        dpo_pairs([group(0, 0.0, 1.0)], tau=-0.1)
    with pytest.raises(ValueError, match="different prompts"):
        dpo_pairs([group(0, 0.0) + group(1, 1.0)])
    with pytest.raises(ValueError, match="non-finite"):
        group(0, float("nan"))
    with pytest.raises(ValueError, match="keep"):
        grpo_groups([group(0, 0.0, 1.0)], keep="best")  # type: ignore[arg-type]


def test_group_by_prompt_orders_prompts_and_keeps_member_order():
    flat = [*group(2, 1.0, 2.0), *group(0, 5.0), Scored(2, "late", (), 3.0)]
    grouped = group_by_prompt(flat)
    assert [[c.text for c in g] for g in grouped] == [["p0c0"], ["p2c0", "p2c1", "late"]]


def test_attach_scores_follows_the_flattening_order():
    done = [
        [SimpleNamespace(prompt_index=0, text=t, token_ids=[1, 2]) for t in ("a", "b")],
        [SimpleNamespace(prompt_index=1, text=t, token_ids=[3]) for t in ("c", "d")],
    ]
    scored = attach_scores(done, [0.1, 0.2, 0.3, 0.4])
    assert [[(c.text, c.score) for c in g] for g in scored] == [
        [("a", 0.1), ("b", 0.2)],
        [("c", 0.3), ("d", 0.4)],
    ]
    assert scored[0][0].token_ids == (1, 2)
    with pytest.raises(ValueError, match="3 scores for 4"):
        attach_scores(done, [0.1, 0.2, 0.3])
