"""The demo's judge: a Bradley-Terry head fitted on preference pairs, loaded back by the
product's RewardModelJudge (its own tokenisation and pooling), and the demo's eval set."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from trainer.evaluation.demo_set import DEFAULT_OUT, ITEMS, MAX_NEW_TOKENS, held_out_prompts
from trainer.evaluation.judges import Pair, RewardModelJudge
from trainer.evaluation.probe_rm import fit_bradley_terry, fit_probe_reward_model
from trainer.synthetic import preference_records

from .test_worker_evaluate import world  # noqa: F401 - the worker on a real DB and store

REPO = Path(__file__).resolve().parents[2]
PAIRS = [
    json.loads(line)
    for line in (REPO / "examples" / "data" / "preferences_small.jsonl").read_text().splitlines()
]


def test_bradley_terry_by_hand():
    # four identical 1-D differences: maximise 4 log σ(w) − w²/2, i.e. 4 (1 − σ(w)) = w
    lo, hi = 0.0, 4.0
    for _ in range(100):  # bisection, independent of the L-BFGS fit
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 4 * (1 - 1 / (1 + math.exp(-mid))) > mid else (lo, mid)
    w = fit_bradley_terry(torch.ones(4, 1), l2=1.0)
    assert w.item() == pytest.approx(lo, abs=1e-6) and lo == pytest.approx(1.0426, abs=1e-3)
    # a feature that flips sign carries no preference: its weight stays ~0; the scale is undone
    d = torch.tensor([[2.0, 1.0], [2.0, -1.0], [6.0, 1.0], [6.0, -1.0]])
    w = fit_bradley_terry(d, l2=1.0)
    assert w[0] > 0 and abs(w[1].item()) < 1e-6


def test_the_fitted_model_loads_as_a_judge_and_learned_the_preference(tmp_path):
    out = fit_probe_reward_model("tiny-llama", PAIRS, tmp_path / "rm")
    judge = RewardModelJudge(out)
    held_out = preference_records(64, seed=99)  # other prompts than the training pairs'
    chosen = judge.score([(r["prompt"], r["chosen"]) for r in held_out])
    rejected = judge.score([(r["prompt"], r["rejected"]) for r in held_out])
    accuracy = sum(c > r for c, r in zip(chosen, rejected, strict=True)) / len(held_out)
    assert accuracy >= 0.9  # the unfitted head (weights 0) scores every answer the same
    r = held_out[1]
    verdicts = judge.judge([Pair(r["prompt"], r["chosen"], r["rejected"])])
    assert verdicts[0].verdict == "A"


def test_the_demo_eval_set_is_held_out_and_regenerable_prompts():
    rows = [json.loads(line) for line in DEFAULT_OUT.read_text().splitlines()]
    assert len(rows) == ITEMS and all(
        set(r) == {"instruction", "output", "generator"} for r in rows
    )
    assert [r["instruction"] for r in rows] == held_out_prompts()
    training = {p["prompt"] for p in PAIRS}
    assert not training & {r["instruction"] for r in rows}
    assert sum(r["instruction"].startswith("What is") for r in rows) == ITEMS // 2
    assert MAX_NEW_TOKENS <= 64  # the demo's time budget (README: ≤ 6 minutes on 2 cores)


def test_the_worker_judges_with_it_by_the_operators_name(world, tmp_path):  # noqa: F811
    """EVAL_REWARD_MODELS → the worker's evaluation subprocess → RewardModelJudge on the
    fitted directory: what make demo does; each item's verdict is the scores' comparison."""
    rm = fit_probe_reward_model("tiny-llama", PAIRS, tmp_path / "rm")
    world.settings = world.settings.model_copy(update={"EVAL_REWARD_MODELS": f"demo-rm={rm}"})
    eid = world.evaluation(
        "instruction",
        data=DEFAULT_OUT.read_bytes(),
        judge={"type": "reward_model", "model": "demo-rm"},
    )
    assert world.run(eid) == "succeeded", world.row(eid).error
    doc = json.loads(world.store.get_bytes(world.row(eid).result["report"]["json"]))
    assert doc["judge"]["name"] == "reward_model:rm" and len(doc["items"]) == 2
    judge = RewardModelJudge(rm)
    for item in doc["items"]:
        model, ref = judge.score(
            [(item["instruction"], item["output"]), (item["instruction"], item["reference"])]
        )
        expected = 0.5 if abs(model - ref) <= 1e-6 else float(model > ref)
        assert [j["score"] for j in item["judgements"]] == [expected, expected]
