"""benchmarks/testbed.py (issue 28): the task is deterministic and disjoint, the arms differ
only in sampling frequency and humanline, the figures' arithmetic (validity, share closed and
its bootstrap CI) by hand, and `--quick` end to end through the service."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import testbed  # noqa: E402
import testbed_figures as tf  # noqa: E402

from contract.spec import JobSpec  # noqa: E402


def test_task_is_deterministic_and_held_out_disjoint(tmp_path):
    setup = testbed.Setup(train_size=50, eval_size=20)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    pa, pb = testbed.make_task(setup, a), testbed.make_task(setup, b)
    for key in pa:
        assert pa[key].read_text() == pb[key].read_text()
    held = {json.loads(line)["problem"] for line in pa["heldout"].read_text().splitlines()}
    grpo = [json.loads(line) for line in pa["grpo"].read_text().splitlines()]
    sft = [json.loads(line) for line in pa["sft"].read_text().splitlines()]
    assert not held & {r["prompt"][0]["content"] for r in grpo}
    assert not held & {r["prompt"] for r in sft}
    q, ans = grpo[0]["prompt"][0]["content"], grpo[0]["answer"]
    x, y = q.rstrip("=").split("+")
    assert int(x) + int(y) == int(ans)


def test_task_tokenizer_gives_every_digit_its_own_token_and_round_trips():
    """The repo's tiny BPE split numbers into shifting chunks (121 → 12|1) and the base
    plateaued below 2%; the task tokenizer keeps each digit one token, in place."""
    setup = testbed.Setup()
    tok = testbed.task_tokenizer(setup)
    assert tok.get_vocab() == testbed.task_tokenizer(setup).get_vocab()  # deterministic
    text = tok.apply_chat_template(
        [{"role": "user", "content": "907+5="}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(text + "912" + tok.eos_token, add_special_tokens=False)["input_ids"]
    pieces = [tok.decode([i]) for i in ids]
    assert pieces[3:8] == ["9", "0", "7", "+", "5"] and pieces[-4:] == ["9", "1", "2", "<|im_end|>"]
    assert tok.decode(ids[-4:], skip_special_tokens=True) == "912"


def test_arms_differ_only_in_sampling_frequency_and_humanline():
    setup = testbed.Setup()
    names = testbed.arms(setup)
    specs = {arm: testbed.grpo_spec(setup, arm, 3, Path("/m"), "file-x") for arm in names}
    for spec in specs.values():
        JobSpec.model_validate(spec)
    assert names["stale-32+humanline"] == (32, testbed.MATH_PRESET_K)
    strip = [
        {**s, "humanline": None, "humanline_params": None, "metadata": None,
         "online": {**s["online"], "sample_every": None}}
        for s in specs.values()
    ]  # fmt: skip
    assert all(s == strip[0] for s in strip)
    assert [s["online"]["sample_every"] for s in specs.values()][:3] == [1, 8, 8]


def _run(acc: float) -> dict:
    keys = ("samples_drawn", "rounds", "sampling_s", "training_s", "wall_clock_s",
            "clamp_frac_max", "clamp_frac_mean", "kl_max", "kl_mean")  # fmt: skip
    return {"accuracy": acc, "curve": {4: acc}, "samples_curve": {4: 8.0},
            **dict.fromkeys(keys, 1.0)}  # fmt: skip


def test_figures_validity_and_share_closed_by_hand():
    setup = {"stales": [8]}
    on, st, hl = [0.50, 0.52, 0.48], [0.20, 0.22, 0.18], [0.40, 0.42, 0.38]
    results = {"online": [_run(v) for v in on], "stale-8": [_run(v) for v in st],
               "stale-8+humanline": [_run(v) for v in hl]}  # fmt: skip
    out = tf.figures(setup, results, 0.1, 12)["by_stale"][8]
    assert out["gap_online_minus_stale"]["value"] == pytest.approx(0.30)
    assert out["gap_online_minus_stale"]["met"]  # 0.30 ≫ 3 × √(2) × 0.0115
    assert out["share_closed"]["value"] == pytest.approx(2 / 3)
    lo, hi = out["share_closed"]["ci95"]
    assert 0.5 < lo <= 2 / 3 <= hi
    assert out["verdict"] == "humanline closes the gap"
    summary = tf.figures(setup, results, 0.1, 12)
    table = tf.markdown(summary)
    assert "| 8 | +30.0 ± 1.6 pts | yes | 0.67 |" in table and "humanline closes the gap" in table
    assert "| online | 50.0 ± 1.2% | 50.0 ± 1.2% |" in table
    results["stale-8"] = [_run(v) for v in (0.49, 0.60, 0.30)]  # gap ~0.04, SE ~0.08: invalid
    out = tf.figures(setup, results, 0.1, 12)["by_stale"][8]
    assert not out["gap_online_minus_stale"]["met"] and not out["share_closed"]["met"]
    assert out["verdict"].startswith("testbed invalid")


@pytest.mark.slow
def test_quick_runs_the_product_path(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'client'}", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/testbed.py"), "--quick", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["mode"] == "quick" and Path(summary["png"]).stat().st_size > 0
    assert set(summary["arms"]) == {"online", "stale-2", "stale-2+humanline"}
    assert [summary["arms"][a]["rounds"] for a in summary["arms"]] == [2, 1, 1]
    page = Path(summary["report"]).read_text()
    assert "Groups by arm" in page  # the service's report draws each arm's curve with bands
    for data in summary["arms"].values():
        assert data["per_seed"][0]["job"] in page
