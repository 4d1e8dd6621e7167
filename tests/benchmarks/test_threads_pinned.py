"""Benchmarks that report a ratio of two step times pin their CPU threads (issue 38:
memory_scale.py's step-time ratio read 3.04 with 2 OpenMP threads beside another job and 0.97
with 1): every configuration's process, and the parent, run on the same threads, 1 unless
asked, and the summary says how many."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import memory_scale  # noqa: E402 - benchmarks/ is on sys.path only from the line above


@pytest.fixture
def restored(monkeypatch):
    """The test process's threads and thread variables, as they were afterwards."""
    before = torch.get_num_threads()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("flag", "expected"), [([], 1), (["--threads", "2"], 2)])
def test_memory_scale_runs_every_configuration_on_pinned_threads(
    monkeypatch, capsys, tmp_path, restored, flag, expected
):
    torch.set_num_threads(3)  # what an unpinned run would inherit
    seen = []

    def run_config(cfg, in_process=False):
        import os

        seen.append((os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()))
        raise RuntimeError("not measured here")

    monkeypatch.setattr(memory_scale, "build", lambda *a: (tmp_path / "m", tmp_path / "d"))
    monkeypatch.setattr(memory_scale, "run_config", run_config)
    memory_scale.main(["--quick", "--work", str(tmp_path), *flag])
    assert seen and set(seen) == {(str(expected), expected)}
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["threads"] == expected
