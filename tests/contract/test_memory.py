"""The training-memory estimate (contract.memory) against numbers worked out by hand, and the
built-in shapes against the models the trainer builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.memory import (
    BUILTIN_SHAPES,
    LOGPS_CHUNK_BYTES,
    LOGPS_MIN_CHUNK,
    RUNTIME_BYTES,
    GiB,
    ModelShape,
    estimate_training_memory,
    keeps_softmax,
    layer_bytes,
)
from contract.micro_batch import choose_micro_batch
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
    """DPO, full fine-tune, fp32, batch 4 pairs, max_length 96 (prompt 48), reference never
    synced, on a CPU: one micro-batch, the shared-prompt layout, chunked log-probs."""
    est = estimate_training_memory(
        spec(batch_size=4, max_length=96, max_prompt_length=48),
        TINY,
        training_file_bytes=1000,
        training_records=10,
    )
    p = 106816
    # per token and layer (H 64, q 64, kv 32, I 128, 4 heads; key length 96), fp32:
    norms = 2 * (4 * 64 + 4 * 64 + 4 * 64)  # input, x·rsqrt, the output the projections share
    attention = 4 * (64 + 32 + 32 + 64) + 4 * 4 + 4 * 96  # q k v out, logsumexp, mask bias
    mlp = 4 * 4 * 128  # gate, up, silu(gate), their product
    assert layer_bytes(TINY, spec(max_length=96, max_prompt_length=48), 96) == 4752
    assert norms + attention + mlp == 4752
    # 4 prompts of 47 tokens, then 8 rows of 1 + 48; 48 kept logit positions per row
    tokens, kept = 4 * 47 + 8 * 49, 8 * 48
    activations = (
        tokens * 3 * 4752  # two layers' saves + the layer in backward's gradients
        + tokens * 12 * 64  # the embeddings' output and the final norm, fp32
        + 8 * 47 * 2 * 2 * 32 * 4  # each row's copy of its prompt's keys and values
    )
    # one chunk (all 384 kept tokens). The softmax (4 x 512 B a token) is at most a quarter
    # of the layers' saves (2 x 4752 B a token), so the head keeps it for backward instead of
    # projecting again. Held throughout: the hidden states and the logsumexp. The head's
    # transient: that fp32 softmax (forward's end to the head's backward, fp32: no cast) and
    # the tied head's fp32 gradient; it comes before a layer's backward, and only what it
    # exceeds that by (here nothing) adds to the peak.
    assert keeps_softmax(spec(batch_size=4, max_length=96, max_prompt_length=48), TINY, False)
    head, layer = kept * 512 * 4 + 512 * 64 * 4, tokens * 4752
    logits = kept * (4 * 64 + 4) + max(0, head - layer)
    assert (activations, logits) == (8_906_432, 99_840)
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
    assert est.total == RUNTIME_BYTES + 20 * p + 1800 + activations + logits
    assert est.drivers()[:3] == ["batch_size", "grad_accum", "max_length"]
    # the old path: full [rows, C, V] fp32 logits + backward's three temporaries (logsumexp's
    # exp, its product with the gradient, gather's zeros: 0.80 of the CPU benchmark's peak
    # with two)
    old = estimate_training_memory(
        spec(batch_size=4, max_length=96, max_prompt_length=48), TINY, chunked_logps=False
    )
    assert old.parts["logits"] == kept * 512 * (4 + 12)
    # checkpointing: the one-pass layout (8 rows of 96), each layer keeps its fp32 input,
    # one layer recomputed plus its gradients
    ckpt = estimate_training_memory(
        spec(batch_size=4, max_length=96, max_prompt_length=48), TINY, checkpointing=True
    )
    assert ckpt.parts["activations"] == 8 * 96 * (2 * 4 * 64 + 2 * 4752 + 12 * 64)
    # ... and the head recomputes (memory was asked for): it keeps hidden states and
    # logsumexp; its chunk (fp32 logits + exp, forward; the recomputed gradient and the tied
    # head's fp32 gradient, backward) stays below the checkpointed layer's backward
    assert ckpt.parts["logits"] == kept * (4 * 64 + 4)
    assert max(kept * 512 * 8, kept * 512 * 4 + 512 * 64 * 4) < 8 * 96 * 2 * 4752


def test_lora_bf16_kto_humanline_by_hand():
    """KTO, LoRA r 8 (bf16 base), humanline k=1: no reference copy, a no_grad KL row per
    example, micro-batches of 8 / 2 = 4 examples (one row each: no shared prompts)."""
    job = spec(
        base_model="smollm2-135m-instruct",
        objective="kto",
        variant="offline+humanline",
        adapter={"kind": "lora", "r": 8},
        precision="bf16",
        batch_size=8,
        grad_accum=2,
        max_length=64,
        max_prompt_length=32,
    )
    est = estimate_training_memory(job, SMOL)
    p, lora = 134_515_008, 921_600
    # per token and layer, bf16 autocast, frozen base (H 576, q 576, kv 192, I 1536, 9 heads):
    norms = 2 * 4 * 576 + 3 * 2 * 576  # fp32 copies of the stream; q/k/v adapters' casts
    attention = 2 * (576 + 192 + 192 + 576) + 4 * 9 + 2 * 64 + 2 * 576  # + o_proj adapter's
    mlp = 3 * 2 * 1536  # gate, up, silu(gate); the frozen down_proj keeps nothing
    adapters = 4 * 8 * 2
    per_layer = norms + attention + mlp + adapters
    assert layer_bytes(SMOL, job, 64) == per_layer == 21732
    tokens, kept = 4 * 64, 4 * 32
    assert est.parts == {
        "runtime": RUNTIME_BYTES,
        "weights": 2 * p + 4 * lora,  # bf16 base, fp32 adapter
        "gradients and optimizer": 12 * lora,
        "reference": 1 * 2 * (4 + 4) * 64 * 4,  # k 1 × 2 micro-batches of 8 rows' fp32 logps
        "training data": 0,
        "activations": tokens * 31 * per_layer + tokens * 12 * 576,
        # a chunk (all 128 kept): bf16 product, fp32 logits, logsumexp's exp, beyond one
        # layer's backward; kept: bf16 hidden states and an fp32 lse per token
        "logits": kept * (2 * 576 + 4) + max(0, kept * 49152 * (2 + 4 + 4) - tokens * per_layer),
        "sampler": 0,
    }
    assert est.parts["activations"] == 174_234_624
    # old path: the graph's logits (bf16 product, fp32 copy) and backward's three fp32
    # temporaries; above the KL rows' forward (bf16, fp32, exp) while those are held
    old = estimate_training_memory(job, SMOL, chunked_logps=False)
    assert old.parts["logits"] == kept * 49152 * (2 + 4 + 12)
    assert kept * 49152 * (2 + 4 + 12) > kept * 49152 * (2 + 4) + kept * 49152 * (2 + 4 + 4)


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


# --- calibration: measured GPU peaks (issue 25) --------------------------------------------
CALIBRATION = Path(__file__).resolve().parents[2] / "contract" / "memory_calibration.json"


def test_estimate_is_within_25_percent_of_every_measured_gpu_peak():
    """Each point's spec rebuilt from the file, priced on the path it was measured on."""
    data = json.loads(CALIBRATION.read_text())
    assert len(data["points"]) == 5
    for point in data["points"]:
        assert point["code_path"] == "full_logits"
        job = spec(
            base_model="x",
            objective=point["objective"],
            variant=point["variant"],
            humanline_params={"sync_every": point["sync_every"]},
            adapter=point["adapter"],
            precision=point["precision"],
            batch_size=point["batch_size"],
            max_prompt_length=point["max_prompt_length"],
            max_length=point["max_length"],
            grad_accum=point["grad_accum"],
        )
        est = estimate_training_memory(
            job,
            ModelShape(**data["shapes"][point["shape"]]),
            checkpointing=point["checkpointing"],
            chunked_logps=False,
            device=point["device"],
        )
        ratio = est.gib / point["measured_gib"]
        assert 0.8 <= ratio <= 1.25, (point, round(ratio, 3), est.parts)


def test_the_chunk_budget_is_the_trainers():
    """(Skipped until trainer.chunked_logps is on this branch.)"""
    chunked_logps = pytest.importorskip("trainer.chunked_logps")

    assert chunked_logps.CHUNK_BYTES == LOGPS_CHUNK_BYTES
    assert chunked_logps.MIN_CHUNK == LOGPS_MIN_CHUNK


# --- choose_micro_batch ----------------------------------------------------------------------
L8 = ModelShape(128256, 4096, 14336, 32, 32, 8, 128, False)


def lora8(**kw) -> JobSpec:
    """8B LoRA DPO, 32 pairs of 512 + 512 (the instruction preset's batch), bf16."""
    base = dict(base_model="x", adapter={"kind": "lora"}, precision="bf16", batch_size=32)
    return spec(**{**base, "max_length": 1024, "max_prompt_length": 512, **kw})


def test_choose_picks_the_largest_micro_batch_that_fits():
    job = lora8(activation_checkpointing="off")
    fits = {
        m: estimate_training_memory(job, L8, grad_accum=32 // m, device="cuda").total
        for m in (32, 16, 8, 4, 2, 1)
    }
    assert all(fits[a] > fits[b] for a, b in zip((32, 16, 8, 4, 2), (16, 8, 4, 2, 1), strict=True))
    available = int(fits[4] / 0.9) + 1  # 4 pairs fit under the margin, 8 do not
    c = choose_micro_batch(job, L8, available, device="cuda")
    assert (c.micro_examples, c.grad_accum, c.rows, c.fits) == (4, 8, 8, True)
    assert not c.activation_checkpointing and c.estimate.total == fits[4]
    assert "4 examples (8 rows) per micro-batch × 8 steps" in c.reason
    # one byte less and 4 no longer fits under the margin: 2 pairs
    assert choose_micro_batch(job, L8, available - 20, device="cuda").micro_examples == 2


def test_choose_is_monotone_in_the_memory_available():
    """Within one checkpointing mode more memory never shrinks the micro-batch; "auto" picks
    one of the two modes' choices (it may trade a checkpointed larger micro-batch for an
    unchecked smaller one once that is large enough: AUTO_UNCHECKPOINTED_TOKENS)."""
    gibs = range(16, 200, 4)
    micro = {}
    for mode in ("on", "off", "auto"):
        job = lora8(activation_checkpointing=mode)
        micro[mode] = [
            choose_micro_batch(job, L8, gib * GiB, device="cuda").micro_examples for gib in gibs
        ]
    for mode in ("on", "off"):
        assert micro[mode] == sorted(micro[mode]) and micro[mode][0] < micro[mode][-1]
    assert micro["on"][-1] == 32
    choices = zip(micro["auto"], micro["on"], micro["off"], strict=True)
    assert all(auto in (on, off) for auto, on, off in choices)


def test_choose_respects_a_set_grad_accum():
    c = choose_micro_batch(lora8(grad_accum=4, activation_checkpointing="off"), L8, 500 * GiB)
    assert (c.grad_accum, c.micro_examples) == (4, 8)  # 32 pairs would fit, as set is kept
    # "auto" may still turn checkpointing on when the set micro-batch fits only with it
    job = lora8(grad_accum=4)
    off = estimate_training_memory(job, L8, device="cuda").total
    on = estimate_training_memory(job, L8, checkpointing=True, device="cuda").total
    c = choose_micro_batch(job, L8, int((on + off) / 2 / 0.9), device="cuda")
    assert (c.grad_accum, c.activation_checkpointing, c.fits) == (4, True, True)


def test_auto_checkpointing_only_when_it_enlarges_the_micro_batch():
    job = lora8()  # activation_checkpointing "auto" by default
    # the whole batch fits without checkpointing: nothing larger to gain, so off
    off32 = estimate_training_memory(job, L8, grad_accum=1, device="cuda").total
    c = choose_micro_batch(job, L8, int(off32 / 0.9) + 1, device="cuda")
    assert (c.micro_examples, c.activation_checkpointing) == (32, False)
    assert "checkpointing off" in c.reason
    # with 44 GiB, checkpointing fits 16 pairs at once; off fits 2 (2 × 2 rows × 1024 = 4,096
    # tokens, too few to fill a GPU: AUTO_UNCHECKPOINTED_TOKENS): on
    c = choose_micro_batch(job, L8, 44 * GiB, device="cuda")
    assert (c.micro_examples, c.grad_accum, c.activation_checkpointing) == (16, 2, True)
    off = choose_micro_batch(lora8(activation_checkpointing="off"), L8, 44 * GiB, device="cuda")
    assert off.micro_examples == 2 and not off.activation_checkpointing  # "off" is kept
    # with 80 GB, off fits 4 pairs (8,192 tokens): enough, so no recompute for a larger one
    c = choose_micro_batch(job, L8, 80 * GiB, device="cuda")
    assert (c.micro_examples, c.grad_accum, c.activation_checkpointing) == (4, 8, False)
    assert choose_micro_batch(
        lora8(activation_checkpointing="on"), L8, 500 * GiB
    ).activation_checkpointing
    # a micro-batch that fits either way (only weights grow: a full fine-tune on tiny-llama)
    small = choose_micro_batch(spec(batch_size=4, max_length=64, max_prompt_length=32), TINY, GiB)
    assert (small.micro_examples, small.activation_checkpointing) == (4, False)


def test_choose_refuses_when_not_even_one_example_fits():
    job = lora8()
    c = choose_micro_batch(job, L8, 16 * GiB, device="cuda")  # the bf16 base alone is ~15 GiB
    smallest = estimate_training_memory(job, L8, grad_accum=32, checkpointing=True, device="cuda")
    assert (c.fits, c.micro_examples, c.grad_accum, c.activation_checkpointing) == (
        False,
        1,
        32,
        True,
    )
    assert c.estimate.parts == smallest.parts and "above 16.0 GiB" in c.reason
    c = choose_micro_batch(lora8(activation_checkpointing="off"), L8, 16 * GiB, device="cuda")
    assert not c.fits and not c.activation_checkpointing


def test_world_splits_the_batch_and_fsdp_divides_the_state():
    full = spec(
        base_model="x", precision="bf16", batch_size=32, max_length=1024, max_prompt_length=512
    )
    one = estimate_training_memory(full, L8, grad_accum=4, device="cuda")
    four = estimate_training_memory(full, L8, grad_accum=1, world=4, device="cuda")
    # 32 pairs over 4 processes in 1 step: the same 8-pair micro-batch as 1 process × 4 steps
    assert four.parts["activations"] == one.parts["activations"]
    assert four.parts["gradients and optimizer"] == one.parts["gradients and optimizer"]  # DDP
    fsdp = full.model_copy(
        update={"parallelism": full.parallelism.model_copy(update={"strategy": "fsdp"})}
    )
    sharded = estimate_training_memory(fsdp, L8, grad_accum=1, world=4, device="cuda")
    p = L8.params
    assert sharded.parts["gradients and optimizer"] == 12 * p // 4
    assert sharded.parts["reference"] == 4 * p // 4  # the frozen copy is sharded too
    layer = (p - 128256 * 4096) // 32
    # fp32 master shards, + two layers and the (untied) embeddings and head gathered in bf16
    assert sharded.parts["weights"] == 4 * p // 4 + (2 * layer + 2 * 128256 * 4096) * 2
    c = choose_micro_batch(fsdp, L8, 80 * GiB, world=4, device="cuda")
    assert c.micro_examples * c.grad_accum == 8  # each process's share of the 32 pairs
    with pytest.raises(ValueError, match="do not split over 3 processes"):
        choose_micro_batch(fsdp, L8, 80 * GiB, world=3)


def test_a_kept_softmax_is_priced_until_the_heads_backward(monkeypatch):
    """SmolLM2's shape, DPO fp32 on a GPU (the plain layout: 16 rows of 512, 256 kept each):
    the softmax (4·V = 0.2 MB a token) is small beside the layers' saves (1.4 MB), so it is
    kept; the head's transient is then every kept token's softmax plus the head's fp32
    gradient, where the recompute's was one chunk's logits. Each counts only above a layer's
    backward, which follows it."""
    job = spec(batch_size=8, max_length=512, max_prompt_length=256)
    shape = BUILTIN_SHAPES["smollm2-135m-instruct"]
    v, h = shape.vocab_size, shape.hidden_size
    assert keeps_softmax(job, shape, False) and not keeps_softmax(job, shape, True)
    kept, layer = 16 * 256, 16 * 512 * layer_bytes(shape, job, 512)
    chunk = LOGPS_CHUNK_BYTES // (4 * v)
    held = kept * (4 * h + 4)
    keep = estimate_training_memory(job, shape, device="cuda").parts["logits"]
    assert keep == held + max(0, kept * v * 4 + v * h * 4 - layer)
    monkeypatch.setattr("contract.memory.SOFTMAX_KEEP_SHARE", 0.0)
    again = estimate_training_memory(job, shape, device="cuda").parts["logits"]
    assert again == held + max(0, max(chunk * v * 8, chunk * v * 4 + v * h * 4) - layer)
    assert keep - again > 300e6  # what the step time's saving costs in memory, here (~0.38 GB)


def test_ktos_no_grad_rows_add_nothing_to_the_steps_head():
    """KTO full FT fp32 on a GPU, SmolLM2's shape (the softmax kept). The mismatched rows'
    policy log-probs are scored under no_grad for the whole step before its first graph
    (trainer.stepwide: z0 over the step) and keep nothing (trainer.chunked_logps, even with
    keep_softmax: tests/trainer/test_no_grad_keeps_nothing.py). Issue 38 found them scored
    while the graph's softmax was held, each keeping its own fp32 softmax too (0.4 GB more
    here, in no part of the estimate); now the head's part is the graph's alone."""
    job = spec(objective="kto", batch_size=8, max_length=512, max_prompt_length=256)
    shape = BUILTIN_SHAPES["smollm2-135m-instruct"]
    v, h = shape.vocab_size, shape.hidden_size
    assert keeps_softmax(job, shape, False)
    kept, layer = 8 * 256, 8 * 512 * layer_bytes(shape, job, 512)
    held = kept * (4 * h + 4)
    est = estimate_training_memory(job, shape, device="cuda").parts["logits"]
    assert est == held + max(0, kept * v * 4 + v * h * 4 - layer)
