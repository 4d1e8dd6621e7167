"""benchmarks/estimate_error.py: its self-check (one real 2-step job) and its verdicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import estimate_error  # noqa: E402


@pytest.mark.slow  # trains tiny-llama 2 steps in a fresh process: ~15 s
def test_one_real_job_is_predicted_within_its_targets():
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "benchmarks/estimate_error.py", "--jobs", "dpo.full", "--steps", "2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    (job,) = result["jobs"]
    assert job["measured"]["steps"] == job["predicted"]["steps"] == 2
    assert result["steps"]["met"] and result["steps"]["worst"] == 1.0
    assert result["tokens"]["met"], result["tokens"]  # the byte approximation, within 1.5x
    assert result["memory"]["met"], result["memory"]
    assert job["measured"]["wall_clock_s"] > 0 and job["predicted"]["wall_clock_s"] > 0
    for figure in ("steps", "tokens", "wall_clock", "memory"):
        assert result[figure]["target"], figure


def test_the_verdicts_take_the_farthest_ratio():
    jobs = [
        {"ratio": {"steps": 1.0, "tokens": 0.7, "wall_clock": 2.5, "memory": None}},
        {"ratio": {"steps": 1.0, "tokens": 1.4, "wall_clock": 0.9, "memory": None}},
    ]
    verdict = estimate_error.summary(jobs)
    assert verdict["steps"] == {"ratios": [1.0, 1.0], "worst": 1.0, "target": "exact", "met": True}
    assert verdict["tokens"]["worst"] == 0.7 and verdict["tokens"]["met"]  # 1/0.7 = 1.43 > 1.4
    assert verdict["wall_clock"]["worst"] == 2.5 and not verdict["wall_clock"]["met"]
    assert verdict["memory"]["met"] is False  # nothing measured is not a pass
