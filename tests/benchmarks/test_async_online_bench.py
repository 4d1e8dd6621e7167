"""benchmarks/async_online.py's self-check: one tiny sync-vs-async comparison runs to its
figures (the ratios themselves are timing, measured by hand: docs/benchmarks.md)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import async_online  # noqa: E402 - benchmarks/ is on sys.path only from the line above


def test_a_tiny_comparison_runs_to_its_figures():
    r = async_online.compare("tiny-llama", 4, "lora", 4, "online")
    assert r["sync"]["lags"] == [] and r["async"]["lags"] == [0, 1]  # lag 1 from step 2
    assert r["async"]["sample_s"] > 0 and r["async"]["train_s"] > 0
    assert 0 < r["wall_ratio"] and 0 < r["overlap_efficiency"]
    assert 0 <= r["trainer_wait_share"] <= 1 and 0 <= r["publish_share"] < 0.5
