"""The training-memory estimate (contract.memory) against numbers worked out by hand, and the
built-in shapes against the models the trainer builds."""

from __future__ import annotations

import json

import pytest

from contract.memory import (
    BUILTIN_SHAPES,
    RUNTIME_BYTES,
    GiB,
    ModelShape,
    estimate_training_memory,
)
from contract.spec import JobSpec

TINY = BUILTIN_SHAPES["tiny-llama"]
SMOL = BUILTIN_SHAPES["smollm2-135m-instruct"]


def spec(**kw) -> JobSpec:
    return JobSpec.model_validate(
        {"base_model": "tiny-llama", "training_file": "f", "objective": "dpo", **kw}
    )


def test_parameter_counts_by_hand():
    # tiny-llama: V 512, H 64, I 128, 2 layers, 4 heads, 2 KV heads of 16, tied embeddings.
    # per layer: q 64·64 + k 64·32 + v 64·32 + o 64·64 + 3 MLP 64·128 + 2 norms of 64
    layer = 4096 + 2048 + 2048 + 4096 + 3 * 8192 + 128
    assert layer == 36992
    assert TINY.params == 512 * 64 + 2 * layer + 64 == 106816
    # SmolLM2-135M: V 49152, H 576, I 1536, 30 layers, 9 heads, 3 KV heads of 64, tied
    layer = 576 * 576 + 2 * 576 * 192 + 576 * 576 + 3 * 576 * 1536 + 2 * 576
    assert SMOL.params == 49152 * 576 + 30 * layer + 576 == 134_515_008  # the published count
    # LoRA r 8 on q, k, v, o: r × (in + out) summed, per layer
    assert (
        SMOL.lora_params(8, ["q_proj", "k_proj", "v_proj", "o_proj"])
        == (8 * ((576 + 576) + (576 + 192) + (576 + 192) + (576 + 576)) * 30)
        == 921_600
    )


def test_full_fine_tune_dpo_fp32_by_hand():
    """DPO, full fine-tune, fp32, batch 4 pairs, max_length 96, reference never synced."""
    est = estimate_training_memory(
        spec(batch_size=4, max_length=96, max_prompt_length=48),
        TINY,
        training_file_bytes=1000,
        training_records=10,
    )
    p = 106816
    rows, length = 2 * 4, 96  # chosen and rejected rows of 4 pairs, every row max_length long
    # per token and layer: 4 norms' fp32 saves (4·64 elements) + fp32 matmul outputs
    # (7·q 64 + 3·kv 32 + 4·I 128 = 1056 elements)
    per_token_layer = 4 * (4 * 64) + 4 * (7 * 64 + 3 * 32 + 4 * 128)
    assert per_token_layer == 5248
    per_token = 2 * 5248 + 4 * 3 * 64  # two layers + embeddings and final norm, fp32
    activations = rows * length * per_token + rows * length * length  # + the bool mask
    logits = rows * (length * 512) * (4 + 8)  # fp32 logits + backward's two fp32 temporaries
    assert (activations, logits) == (8_724_480, 4_718_592)
    assert est.parts == {
        "runtime": RUNTIME_BYTES,
        "weights": 4 * p,
        "gradients and optimizer": 12 * p,
        "reference": 4 * p,  # the frozen fp32 copy
        "training data": 1000 + 10 * 80,  # the file's size + each record's offsets
        "activations": activations,
        "logits": logits,
        "sampler": 0,
    }
    assert est.total == RUNTIME_BYTES + 20 * p + 1800 + 8_724_480 + 4_718_592
    assert est.drivers()[:3] == ["batch_size", "grad_accum", "max_length"]


def test_lora_bf16_kto_humanline_by_hand():
    """KTO, LoRA r 8 (bf16 base), humanline k=1: no reference copy, a no_grad KL row per
    example, micro-batches of 8 / 2 = 4 examples."""
    est = estimate_training_memory(
        spec(
            base_model="smollm2-135m-instruct",
            objective="kto",
            variant="offline+humanline",
            adapter={"kind": "lora", "r": 8},
            precision="bf16",
            batch_size=8,
            grad_accum=2,
            max_length=64,
            max_prompt_length=32,
        ),
        SMOL,
    )
    p, lora = 134_515_008, 921_600
    per_token_layer = 4 * 4 * 576 + 2 * (7 * 576 + 3 * 192 + 4 * 1536) + 2 * 5 * 576
    assert per_token_layer == 36480  # fp32 norms, bf16 matmul outputs, bf16 input casts
    per_token = 30 * per_token_layer + 4 * 3 * 576
    elems = 64 * 49152
    assert est.parts == {
        "runtime": RUNTIME_BYTES,
        "weights": 2 * p + 4 * lora,  # bf16 base, fp32 adapter
        "gradients and optimizer": 12 * lora,
        "reference": 1 * 2 * (4 + 4) * 64 * 4,  # k 1 × 2 micro-batches of 8 rows' fp32 logps
        "training data": 0,
        "activations": 4 * 64 * per_token + 4 * 64 * 64,
        # the KL rows' forward (bf16 logits, fp32 copy, logsumexp's exp) while the graph's
        # logits (bf16 + fp32) are held: larger than backward's start
        "logits": 4 * elems * (2 + 4) + 4 * elems * (2 + 4 + 4),
        "sampler": 0,
    }
    assert est.parts["activations"] == 281_952_256 and est.parts["logits"] == 201_326_592


def test_online_samplers_are_counted_once_or_held():
    base = dict(
        objective="grpo",
        variant="online",
        max_steps=4,
        batch_size=16,
        max_length=128,
        max_prompt_length=64,
        adapter={"kind": "lora", "r": 4},
    )
    hf = estimate_training_memory(spec(**base, online={"engine": "hf", "num_samples": 8}), TINY)
    # transformers' generate between steps: 64 rows of 64 + 256 tokens of KV cache, fp32
    kv = 2 * 2 * 32 * (64 + 256) * 64 * 4
    prefill = 64 * 64 * (2 * 64 + 2 * 128) * 4
    assert hf.parts["sampler"] == kv + prefill + 64 * 320 * 320 + 64 * 512 * 4
    step = hf.parts["activations"] + hf.parts["logits"]
    static = hf.total - max(step, hf.parts["sampler"])
    assert static == sum(
        v for k, v in hf.parts.items() if k not in ("activations", "logits", "sampler")
    )
    # vLLM keeps its weights (fp32 here) and its KV cache through training
    vllm = estimate_training_memory(
        spec(**base, online={"engine": "vllm", "num_samples": 8, "vllm": {"kv_cache_gib": 2}}),
        TINY,
    )
    assert vllm.parts["sampler"] == 106816 * 4 + 2 * GiB
    assert vllm.total == hf.total - max(step, hf.parts["sampler"]) + step + 2 * GiB + 106816 * 4
    assert "online.vllm.kv_cache_gib" in vllm.drivers()


def test_grpo_rows_count_sequences():
    """A GRPO micro-batch has batch_size / grad_accum sequences (a pair is a group of two)."""
    grpo = estimate_training_memory(
        spec(objective="grpo", batch_size=8, max_length=32, max_prompt_length=16), TINY
    )
    dpo = estimate_training_memory(
        spec(objective="dpo", batch_size=4, max_length=32, max_prompt_length=16), TINY
    )
    assert grpo.parts["activations"] == dpo.parts["activations"]  # 8 rows each


def test_shape_from_config_defaults_and_fallbacks():
    gpt2 = ModelShape.from_config({"vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12})
    assert (gpt2.intermediate_size, gpt2.num_kv_heads, gpt2.head_dim) == (3072, 12, 64)
    assert not gpt2.tie_word_embeddings  # not said: counted untied (the larger)
    nested = ModelShape.from_config(
        {
            "text_config": {
                "vocab_size": 10,
                "hidden_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
            }
        }
    )
    assert nested.hidden_size == 8
    with pytest.raises(ValueError, match="hidden_size"):
        ModelShape.from_config({"vocab_size": 10})


def test_builtin_shapes_match_the_built_models():
    """The API estimates built-ins without their files: the shapes it uses must be the
    config.json the trainer builds (tiny-llama is built here; SmolLM2 when cached)."""
    from trainer.modeling.sources import cache_dir, resolve_model

    tiny = resolve_model("tiny-llama")
    assert ModelShape.from_config(json.loads((tiny / "config.json").read_text())) == TINY
    smol = cache_dir() / "models" / "smollm2-135m-instruct" / "config.json"
    if smol.is_file():
        assert ModelShape.from_config(json.loads(smol.read_text())) == SMOL
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny)
    assert sum(p.numel() for p in model.parameters()) == TINY.params
