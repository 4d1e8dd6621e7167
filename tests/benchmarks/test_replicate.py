"""benchmarks/replicate.py: the arms' specs, the figures' arithmetic, and `--quick` end to end
through the service (upload → jobs → evaluations → comparison report) on tiny-llama."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import replicate  # noqa: E402

from contract.spec import JobSpec  # noqa: E402


def test_arms_differ_only_in_sampling_frequency_and_humanline():
    setup = replicate.Setup(stale=8, seeds=[3])
    specs = {arm: replicate.job_spec(setup, arm, 3, "file-x") for arm in replicate.ARMS}
    for spec in specs.values():
        JobSpec.model_validate(spec)  # a valid job spec as the API takes it
    assert [s["online"]["sample_every"] for s in specs.values()] == [1, 8, 8]
    assert [s["humanline"] for s in specs.values()] == [False, False, True]
    strip = [
        {**s, "humanline": None, "metadata": None, "online": {**s["online"], "sample_every": None}}
        for s in specs.values()
    ]
    assert strip[0] == strip[1] == strip[2]  # nothing else differs: same seed, steps, data
    eps = [JobSpec.model_validate(s).resolved().objective.epsilon for s in specs.values()]
    assert eps == [0.15, 0.15, 0.15]  # the reference moves in every arm (paper: ε 0.15)


def _run(arm_pass: list[float], rounds: int) -> dict:
    return {"pass_at_1": arm_pass, "wall_clock_s": 1.0, "rounds": rounds,
            "sampled_tokens": 10.0, "trained_tokens": 20.0}  # fmt: skip


def test_figures_gap_closed_by_hand():
    setup = replicate.Setup(stale=8, seeds=[0, 1])
    results = {
        "online": [_run(0.50, 16), _run(0.40, 16)],  # mean 0.45
        "stale": [_run(0.20, 2), _run(0.30, 2)],  # mean 0.25
        "stale+humanline": [_run(0.42, 2), _run(0.30, 2)],  # mean 0.36
    }
    out = replicate.figures(setup, results, base=0.1)
    assert out["gap_online_minus_stale"] == pytest.approx(0.20)
    assert out["gap_closed"]["value"] == pytest.approx(0.55) and out["gap_closed"]["met"]
    assert out["sampling_rounds_ratio"]["value"] == pytest.approx(2 / 16)
    assert out["sampling_rounds_ratio"]["met"]
    assert out["arms"]["online"]["pass_at_1"]["se"] == pytest.approx(0.05)  # stdev .0707/√2
    results["stale+humanline"] = [_run(0.30, 2), _run(0.25, 2)]  # closes 0.125/0.2
    assert not replicate.figures(setup, results, base=None)["gap_closed"]["met"]


@pytest.mark.slow
def test_quick_runs_the_product_path(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'client'}", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/replicate.py"), "--quick", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["mode"] == "quick"
    for arm in replicate.ARMS:
        (run,) = summary["arms"][arm]["per_seed"]
        assert 0.0 <= run["pass_at_1"] <= 1.0 and run["sampled_tokens"] > 0
        assert run["trained_tokens"] > 0 and run["wall_clock_s"] > 0
    assert [summary["arms"][a]["rounds"] for a in replicate.ARMS] == [2, 1, 1]
    page = Path(summary["report"]).read_text()
    for arm in replicate.ARMS:
        assert summary["arms"][arm]["per_seed"][0]["job"] in page
