"""DDP with 2 CPU processes trains like 1 process on the same global batch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.checkpoint import read_weights
from worker.launch import trainer_command
from worker.routing import Placement, trainer_env

REPO = Path(__file__).resolve().parents[2]


def _run(cmd, out: Path, env: dict | None = None):
    env = {**(env or os.environ), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_weights(out / "checkpoints" / "step-4")


def _world_size(out: Path) -> int:
    events = [json.loads(ln) for ln in (out / "events.jsonl").read_text().splitlines()]
    return next(e["data"]["world_size"] for e in events if e["kind"] == "started")


@pytest.mark.parametrize("objective", ["dpo", "kto", "grpo"])
def test_two_processes_match_one(tmp_path, pref_file, unpaired_file, objective):
    data = unpaired_file if objective == "kto" else pref_file  # KTO: metrics only some ranks have
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"base_model: tiny-llama\ntraining_file: {data}\nobjective: {objective}\n"
        "variant: offline+humanline\nbatch_size: 4\nmax_steps: 4\nmax_length: 96\n"
        "max_prompt_length: 48\nquality_sample: 0\noptim: {lr: 0.003, warmup_ratio: 0.0}\n"
    )
    # the worker's own argv, for 1 and for 2 CPU ranks (`accelerate launch --cpu` starts one)
    alone = trainer_command(
        sys.executable, spec, tmp_path / "one", resume=False, place=Placement(1, cpu=True)
    )
    one = _run(alone, tmp_path / "one")
    place = Placement(2, cpu=True)
    argv = trainer_command(sys.executable, spec, tmp_path / "two", resume=False, place=place)
    two = _run(argv, tmp_path / "two", env=trainer_env(place))
    assert (_world_size(tmp_path / "one"), _world_size(tmp_path / "two")) == (1, 2)
    assert one.keys() == two.keys()
    for k in one:
        assert torch.allclose(one[k], two[k], atol=2e-5, rtol=1e-4), (
            k,
            (one[k] - two[k]).abs().max(),
        )
