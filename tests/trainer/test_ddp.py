"""DDP with 2 CPU processes trains like 1 process on the same global batch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]


def _run(cmd, out: Path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_file(out / "checkpoints" / "step-4" / "weights.safetensors")


@pytest.mark.parametrize("objective", ["dpo", "kto", "grpo"])
def test_two_processes_match_one(tmp_path, pref_file, objective):
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"base_model: tiny-llama\ntraining_file: {pref_file}\nobjective: {objective}\n"
        "variant: offline+humanline\nbatch_size: 4\nmax_steps: 4\nmax_length: 96\n"
        "max_prompt_length: 48\nquality_sample: 0\noptim: {lr: 0.003, warmup_ratio: 0.0}\n"
    )
    one = _run([sys.executable, "-m", "trainer", "run", str(spec), "--out", str(tmp_path / "one"), "--no-progress"], tmp_path / "one")
    two = _run([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--cpu",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "-m", "trainer", "run", str(spec), "--out", str(tmp_path / "two"), "--no-progress"], tmp_path / "two")
    assert one.keys() == two.keys()
    for k in one:
        assert torch.allclose(one[k], two[k], atol=2e-5, rtol=1e-4), (k, (one[k] - two[k]).abs().max())
