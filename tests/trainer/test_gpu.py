"""GPU paths (skipped without CUDA): bf16 training and humanline's overhead on a real GPU."""

import json

import pytest
import torch

from contract.spec import JobSpec
from trainer.train import Trainer, train

pytestmark = pytest.mark.gpu


def _spec(pref_file, **kw):
    base = {
        "base_model": "smollm2-135m-instruct",
        "training_file": str(pref_file),
        "objective": "dpo",
        "batch_size": 8,
        "max_steps": 8,
        "max_length": 160,
        "max_prompt_length": 96,
        "precision": "bf16",
        "optim": {"lr": 1e-5, "warmup_ratio": 0.0},
        "quality_sample": 16,
    }
    return JobSpec.model_validate({**base, **kw})


@pytest.mark.parametrize("adapter", [{"kind": "none"}, {"kind": "lora", "r": 16, "alpha": 32}])
def test_bf16_humanline_dpo_trains_on_gpu(tmp_path, pref_file, adapter):
    result = train(
        _spec(pref_file, variant="offline+humanline", adapter=adapter), tmp_path, progress=False
    )
    assert result.status == "succeeded"
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert rows[-1]["rewards/margins"] > 0


def test_humanline_overhead_on_gpu(tmp_path, pref_file):
    """Interleaved steps: humanline (k=1) ÷ offline ≤ 1.05 on the GPU."""
    off = Trainer(
        _spec(pref_file, variant="offline", max_steps=12), tmp_path / "off", progress=False
    )
    hl = Trainer(
        _spec(pref_file, variant="offline+humanline", max_steps=12), tmp_path / "hl", progress=False
    )
    t_off, t_hl = [], []
    for s in range(1, 13):
        t_off.append(off.step(s)["step_time"])
        t_hl.append(hl.step(s)["step_time"])
    ratio = sorted(t_hl[2:])[len(t_hl[2:]) // 2] / sorted(t_off[2:])[len(t_off[2:]) // 2]
    assert ratio <= 1.05, ratio
