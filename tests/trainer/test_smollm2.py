"""The real small model: SmolLM2-135M-Instruct with LoRA, a few steps of humanline DPO."""

import json

import pytest
import torch
from safetensors.torch import load_file

from contract.spec import JobSpec
from trainer.train import train


@pytest.mark.slow
def test_smollm2_lora_humanline_dpo(tmp_path, pref_file):
    spec = JobSpec.model_validate(
        {
            "base_model": "smollm2-135m-instruct",
            "training_file": str(pref_file),
            "objective": "dpo",
            "variant": "offline+humanline",
            "batch_size": 4,
            "max_steps": 4,
            "max_length": 128,
            "max_prompt_length": 96,
            "adapter": {"kind": "lora", "r": 8, "alpha": 16},
            "optim": {"lr": 5e-4, "warmup_ratio": 0.0},
            "quality_sample": 16,
            "checkpoint_every": 2,
        }
    )
    result = train(spec, tmp_path, progress=False)
    assert result.status == "succeeded"
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert abs(rows[0]["loss"] - 0.6931) < 1e-3  # step 1: reference == policy, loss = log 2
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert rows[-1]["rewards/margins"] > 0  # the adapter learned to prefer the chosen answers
    adapter = load_file(tmp_path / "final" / "adapter_model.safetensors")
    assert adapter and all(torch.isfinite(t).all() for t in adapter.values())
    quality = json.loads((tmp_path / "data_quality.json").read_text())
    assert quality["n"] == 32 and -20 < quality["mean"] < 0  # real model: plausible log-probs


@pytest.mark.slow
def test_smollm2_online_humanline_grpo_on_arithmetic(tmp_path):
    """The paper's math setup in miniature: humanline GRPO sampling every 8 steps on the
    shipped arithmetic prompts, with the tag_count/format/accuracy rewards weighted 1/1/8."""
    from pathlib import Path

    prompts = Path(__file__).resolve().parents[2] / "examples" / "data" / "arithmetic_train.jsonl"
    spec = JobSpec.model_validate(
        {
            "base_model": "smollm2-135m-instruct",
            "training_file": str(prompts),
            "objective": "grpo",
            "variant": "online+humanline",
            "batch_size": 8,
            "max_steps": 9,
            "max_length": 256,  # 2 groups of 4
            "max_prompt_length": 160,
            "adapter": {"kind": "lora", "r": 8, "alpha": 16},
            "humanline_params": {"sync_every": 4},
            "optim": {"lr": 1e-4, "warmup_ratio": 0.0},
            "online": {
                "num_samples": 4,
                "max_new_tokens": 48,
                "sample_every": 8,
                "engine": "hf",
                "tau": 0.0,
            },
        }
    )
    result = train(spec, tmp_path, progress=False)
    assert result.status == "succeeded" and result.step == 9
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], r["reward/mean"]) for r in rows if "reward/mean" in r]
    assert [s for s, _ in curve] == [1, 9]  # a round every 8 steps (the second is 1 step)
    for r in rows:
        if "round/index" in r:
            for part in ("reward/tag_count", "reward/format", "reward/math_accuracy"):
                assert 0.0 <= r[part] <= 1.0
            assert r["round/sample_time"] > 0 and r["round/score_time"] >= 0
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
