"""Online rounds end to end on tiny-llama with the transformers engine and real rewards."""

import json
from pathlib import Path

import pytest
import torch

import trainer.train as train_mod
from contract.spec import JobSpec
from trainer.checkpoint import read_weights
from trainer.logps import token_logps
from trainer.modeling import load_trainable_state_dict
from trainer.synthetic import write_jsonl


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    rows = [
        {"prompt": f"What is {a} + {b}? Answer in <answer></answer> tags.", "answer": str(a + b)}
        for a in range(2, 10)
        for b in range(3, 7)
    ]
    return write_jsonl(tmp_path_factory.mktemp("prompts") / "arith.jsonl", rows)


def online_spec(prompt_file, reward_model_dir, **kw) -> JobSpec:
    base = {
        "base_model": "tiny-llama",
        "training_file": str(prompt_file),
        "objective": "dpo",
        "variant": "online",
        "batch_size": 4,
        "max_steps": 4,
        "max_length": 96,
        "max_prompt_length": 48,
        "optim": {"lr": 3e-3, "warmup_ratio": 0.0},
        "online": {
            "num_samples": 4,
            "max_new_tokens": 12,
            "sample_every": 2,
            "engine": "hf",
            "rewards": [
                {"name": "math_accuracy", "weight": 8.0},
                {"name": "reward_model", "weight": 1.0, "options": {"path": str(reward_model_dir)}},
            ],
        },
    }
    return JobSpec.model_validate({**base, **kw})


def metrics(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("objective", ["dpo", "kto", "grpo"])
@pytest.mark.parametrize("variant", ["online", "online+humanline"])
def test_online_rounds_run_end_to_end(tmp_path, prompt_file, reward_model_dir, objective, variant):
    # GRPO's batch_size counts sequences: 16 = the 4 groups of 4 a step trained on before
    spec = online_spec(
        prompt_file,
        reward_model_dir,
        objective=objective,
        variant=variant,
        batch_size=16 if objective == "grpo" else 4,
    )
    result = train_mod.train(spec, tmp_path, progress=False)
    assert result.status == "succeeded" and result.step == 4
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # a round every 2 steps, with sampling and scoring timed apart from training
    firsts = [r for r in rows if "round/index" in r]
    assert [r["step"] for r in firsts] == [1, 3]
    for r in firsts:
        assert r["round/sample_time"] > 0 and r["round/score_time"] > 0 and r["round/examples"] >= 8
        assert r["round/sampled_tokens"] >= r["round/prompts"] * 4  # G=4 completions, >= 1 token
        assert "reward/math_accuracy" in r and "reward/reward_model" in r
    events = [json.loads(ln) for ln in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert sum(e["kind"] == "round" for e in events) == 2
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)


@pytest.mark.parametrize(
    "variant, table",
    [
        # step -> the step whose forward-pass weights the reference must hold; rounds are 1-3, 4-6
        ("online", {1: 1, 2: 1, 3: 1, 4: 4, 5: 4, 6: 4}),  # the policy at the round's start
        ("online+humanline", {1: 1, 2: 1, 3: 2, 4: 4, 5: 4, 6: 5}),  # + humanline k=1 inside rounds
    ],
)
def test_online_reference_is_round_start_then_humanline(
    recorded_losses, tmp_path, prompt_file, reward_model_dir, variant, table
):
    calls, holder = recorded_losses
    spec = online_spec(
        prompt_file,
        reward_model_dir,
        variant=variant,
        max_steps=6,
        online={
            "num_samples": 4,
            "max_new_tokens": 10,
            "sample_every": 3,
            "engine": "hf",
            "rewards": [{"name": "reward_model", "options": {"path": str(reward_model_dir)}}],
        },
        optim={"lr": 1e-2, "warmup_ratio": 0.0},
    )
    train_mod.train(spec, tmp_path, progress=False)
    probe = holder["model"]
    for t, src in table.items():
        load_trainable_state_dict(probe, calls[src - 1]["weights"])
        with torch.no_grad():
            expected = token_logps(probe.eval(), calls[t - 1]["batch"])
        assert torch.allclose(calls[t - 1]["ref"], expected, atol=1e-5), (variant, t, src)
        if src != t:  # the weights really moved, so the check can tell them apart
            load_trainable_state_dict(probe, calls[t - 1]["weights"])
            with torch.no_grad():
                current = token_logps(probe.eval(), calls[t - 1]["batch"])
            assert not torch.allclose(calls[t - 1]["ref"], current, atol=1e-5), (variant, t)


def test_online_resume_mid_round_is_bitwise_identical(tmp_path, prompt_file, reward_model_dir):
    spec = online_spec(
        prompt_file,
        reward_model_dir,
        objective="grpo",
        variant="online+humanline",
        max_steps=4,
        checkpoint_every=1,
        batch_size=16,  # 4 groups of 4 sequences
    )
    train_mod.train(spec, tmp_path / "full", progress=False)
    part = tmp_path / "part"
    part.mkdir()
    (part / "STOP").touch()
    assert train_mod.train(spec, part, progress=False).step == 1  # stops inside round 0
    (part / "STOP").unlink()
    assert train_mod.train(spec, part, resume=True, progress=False).step == 4
    a = read_weights(tmp_path / "full" / "checkpoints" / "step-4")
    b = read_weights(part / "checkpoints" / "step-4")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_online_spec_validation():
    with pytest.raises(ValueError, match="max_steps"):
        JobSpec.model_validate(
            {
                "base_model": "tiny-llama",
                "training_file": "x",
                "objective": "dpo",
                "variant": "online",
            }
        )
    with pytest.raises(ValueError, match="unknown reward"):
        JobSpec.model_validate(
            {
                "base_model": "tiny-llama",
                "training_file": "x",
                "objective": "dpo",
                "variant": "online",
                "max_steps": 2,
                "online": {"rewards": [{"name": "exec_python"}]},
            }
        )
    with pytest.raises(ValueError, match="data_source 'online'"):
        JobSpec.model_validate(
            {
                "base_model": "tiny-llama",
                "training_file": "x",
                "objective": "dpo",
                "online": {"sample_every": 2},
            }
        )


def test_a_round_draws_only_the_prompts_it_needs(tmp_path, prompt_file, reward_model_dir):
    """GRPO keeping every group: a round of 2 steps × 4 groups samples 8 prompts, not one more
    (each extra prompt is sampled, scored and thrown away)."""
    spec = online_spec(prompt_file, reward_model_dir, objective="grpo", batch_size=16)
    spec = spec.model_copy(
        update={"online": spec.online.model_copy(update={"zero_variance_groups": "keep"})}
    )
    assert train_mod.train(spec, tmp_path, progress=False).status == "succeeded"
    rounds = [r for r in metrics(tmp_path) if "round/index" in r]
    assert [(r["round/prompts"], r["round/examples"]) for r in rounds] == [(8.0, 8.0)] * 2
