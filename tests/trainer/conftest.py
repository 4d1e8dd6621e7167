"""Trainer fixtures: a shared model cache, small generated datasets and random models.

    save_random_model(out, model_class, tokenizer, **config)   a random Llama of tiny-llama's
                                      config with `config` on top (seed 0), saved to `out`
    moved_policy(**adapter)           tiny-llama's policy (trainer.modeling.load_policy) with its
                                      trainable weights moved off their init (LoRA's zero B too)
    reward_model_dir                  a random one-output sequence classifier (continuous scores)
    recorded_losses                   (calls, holder): every loss call's trainable weights,
                                      batch, reference and policy log-probs and the rest of its
                                      arguments; holder["model"], holder["loss"] (the real one)
"""

from pathlib import Path

import pytest

from contract.spec import JobSpec
from trainer.synthetic import preference_records, unpaired_records, write_jsonl


@pytest.fixture(scope="session", autouse=True)
def _model_cache(tmp_path_factory):
    """One cache per test session (the CI clone starts empty; a dev's cache is reused)."""
    import os

    if "HUMANLINE_CACHE" not in os.environ:
        os.environ["HUMANLINE_CACHE"] = str(Path.home() / ".cache" / "humanline")
    yield


@pytest.fixture(scope="session")
def pref_file(tmp_path_factory) -> Path:
    return write_jsonl(
        tmp_path_factory.mktemp("data") / "pref.jsonl", preference_records(64, seed=1)
    )


@pytest.fixture(scope="session")
def unpaired_file(tmp_path_factory) -> Path:
    return write_jsonl(
        tmp_path_factory.mktemp("data") / "unpaired.jsonl", unpaired_records(64, seed=2)
    )


@pytest.fixture
def make_spec(pref_file):
    def make(**kw) -> JobSpec:
        base = {
            "base_model": "tiny-llama",
            "training_file": str(pref_file),
            "objective": "dpo",
            "batch_size": 4,
            "max_steps": 6,
            "max_length": 96,
            "max_prompt_length": 48,
            "optim": {"lr": 1e-3, "warmup_ratio": 0.0},
            "quality_sample": 8,
        }
        return JobSpec.model_validate({**base, **kw})

    return make


def save_random_model(out: Path, model_class, tokenizer, **config) -> Path:
    """A `model_class` (LlamaForCausalLM, LlamaForSequenceClassification) of tiny-llama's shape
    with `config` on top, random weights from seed 0 (the caller's RNG stream untouched), saved
    to `out` with `tokenizer` (trainer.modeling.sources.save_random_llama)."""
    from contract.memory import BUILTIN_SHAPES
    from trainer.modeling.sources import save_random_llama

    shape = {**BUILTIN_SHAPES["tiny-llama"].llama_config(), **config}
    save_random_llama(
        out, shape, tokenizer, seed=0, max_position_embeddings=2048, model_class=model_class
    )
    return out


def moved_policy(**adapter):
    """load_policy of tiny-llama with `adapter` (default full fine-tuning), every trainable weight
    moved by N(0, 0.02) noise from seed 0, so a LoRA adapter changes what the model computes."""
    import torch

    from trainer.modeling import load_policy, resolve_model

    torch.manual_seed(0)
    spec = JobSpec(
        base_model="tiny-llama",
        training_file="x.jsonl",
        objective="dpo",
        adapter=adapter or {"kind": "none"},
    )
    model = load_policy(spec, resolve_model("tiny-llama"))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, dtype=p.dtype) * 0.02)
    return model


@pytest.fixture(scope="session")
def reward_model_dir(tmp_path_factory) -> Path:
    """A real sequence-classification checkpoint (random weights): continuous scores."""
    from transformers import LlamaForSequenceClassification

    from trainer.modeling import load_tokenizer, resolve_model

    shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    heads = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}
    return save_random_model(
        tmp_path_factory.mktemp("rm"),
        LlamaForSequenceClassification,
        load_tokenizer(resolve_model("tiny-llama")),
        num_labels=1,
        **shape,
        **heads,
    )


@pytest.fixture
def recorded_losses(monkeypatch):
    """Wraps the recipe's loss: `calls` gets, per call, the trainable weights the policy had
    during that forward ("weights"), the batch, the reference and policy log-probs the loss
    received ("ref", "pol") and its other arguments ("mb", "examples", "ctx");
    `holder["model"]` is the policy, `holder["loss"]` the recipe's own loss."""
    import trainer.train as train_mod
    from trainer.modeling import trainable_state_dict

    calls: list[dict] = []
    holder: dict = {}
    real_load, real_recipe = train_mod.load_policy, train_mod.make_recipe

    def load_policy(spec, model_dir):
        holder["model"] = real_load(spec, model_dir)
        return holder["model"]

    def make_recipe(spec):
        recipe = real_recipe(spec)
        real_loss = holder["loss"] = recipe.loss

        def loss(pol, ref, batch, mb, examples, ctx):
            state = trainable_state_dict(holder["model"])
            calls.append({
                "weights": {k: v.detach().clone() for k, v in state.items()},
                "batch": batch, "ref": ref.detach().clone(), "pol": pol.detach().clone(),
                "mb": mb, "examples": examples, "ctx": ctx,
            })  # fmt: skip
            return real_loss(pol, ref, batch, mb, examples, ctx)

        recipe.loss = loss
        return recipe

    monkeypatch.setattr(train_mod, "load_policy", load_policy)
    monkeypatch.setattr(train_mod, "make_recipe", make_recipe)
    return calls, holder
