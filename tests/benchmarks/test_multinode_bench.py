"""benchmarks/multinode.py (issue 26's checkpoint and two-node benchmark): its --self-check (a
two-layer shape, 4 steps) runs every part to the JSON line, with every figure and target."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_self_check_measures_every_figure():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "multinode.py"), "--self-check"],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result["targets"]) == set(result["met"]) == {
        "save_time_ratio", "save_peak_rss_ratio", "two_nodes_step_ratio",
    }  # fmt: skip
    for key in ("dcp_save_s", "gathered_save_s", "one_node_step_s", "two_nodes_step_s"):
        assert result[key] > 0, key
    for key in result["targets"]:
        assert result[key] > 0 and result["met"][key] == (
            result[key] <= float(result["targets"][key][3:])
        )
