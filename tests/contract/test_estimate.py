"""contract.estimate: the throughput table reproduces the GPU proof's figure it was calibrated
on, other sizes scale by FLOPs, and steps, rows and GPUs follow the spec (issue 27 item 4)."""

from __future__ import annotations

import pytest

from contract.estimate import estimate_job, row_tokens, throughput_table
from contract.memory import GiB
from contract.shapes import BUILTIN_SHAPES, ModelShape
from contract.spec import JobSpec

# The GPU proof's Llama-3.2-1B shape (benchmarks/gpu_models.py): 1.24 B parameters.
ONE_B = ModelShape(128256, 2048, 8192, 16, 32, 8, 64, True)
EIGHT_B = ModelShape(128256, 4096, 14336, 32, 32, 8, 128, False)


def _spec(**kw) -> JobSpec:
    body = {
        "base_model": "tiny-llama", "training_file": "f", "objective": "dpo", "batch_size": 8,
        "max_length": 512, "max_prompt_length": 256, "precision": "bf16", "max_steps": 100,
        "activation_checkpointing": "off", **kw,
    }  # fmt: skip
    return JobSpec.model_validate(body).resolved()


def _estimate(spec: JobSpec, shape: ModelShape, device: str = "h100", processes: int = 1, **kw):
    # 10 kB records: every row is max_length long
    args = {"file_format": "preference", "file_bytes": 10**10, "records": 10**6} | kw
    return estimate_job(
        spec, shape, device=device, processes=processes, memory_bytes=80 * GiB, **args
    )


def test_the_gpu_proofs_figure_is_reproduced():
    """docs/deploy.md: 1.24 B, full fine-tuning, bf16, 8 × (256 + 256): 32,200 tokens/s on an
    H100 (MFU 25 %). Every row at max_length 512 (the file's rows are longer)."""
    est = _estimate(_spec(), ONE_B)
    assert est.tokens_per_step == 16 * 512
    tokens_per_s = est.tokens / est.train_seconds
    assert tokens_per_s == pytest.approx(32_200, rel=0.02)
    # MFU as the proof counts it (6N + 12 L h T per token over 989 TFLOP/s)
    n, attention = ONE_B.params, 12 * 16 * 2048 * 512
    assert tokens_per_s * (6 * n + attention) / 989e12 == pytest.approx(0.25, rel=0.02)


def test_sizes_scale_by_flops_and_lora_costs_less():
    one_b, eight_b = _estimate(_spec(), ONE_B), _estimate(_spec(), EIGHT_B)
    ratio = eight_b.train_seconds / one_b.train_seconds
    assert ratio == pytest.approx(eight_b.train_flops / one_b.train_flops, rel=1e-4)
    assert 5 < ratio < 8  # 8.03 B / 1.24 B parameters, attention grows less
    lora = _estimate(_spec(adapter={"kind": "lora", "r": 16}), EIGHT_B)
    # 4N + 2N instead of 6N + 2N a token (attention aside): about 3/4 of the time
    assert lora.train_seconds / eight_b.train_seconds == pytest.approx(0.75, abs=0.02)
    ckpt = _estimate(_spec(activation_checkpointing="on"), ONE_B)
    assert ckpt.activation_checkpointing and ckpt.train_seconds > one_b.train_seconds


def test_gpus_hours_and_memory():
    est = _estimate(_spec(batch_size=64), ONE_B, processes=4)
    assert est.gpus == 4 and est.micro_batch * est.grad_accum == 16  # 64 pairs over 4 GPUs
    one = _estimate(_spec(batch_size=64), ONE_B)
    assert est.train_seconds == pytest.approx(one.train_seconds / 4, rel=1e-4)
    # a step's fixed cost is its floor: 8 pairs over 4 GPUs are launch-bound
    small = _estimate(_spec(), ONE_B, processes=4)
    assert small.train_seconds == pytest.approx(100 * 0.14)
    assert est.gpu_hours == pytest.approx(est.wall_clock_seconds * 4 / 3600, rel=1e-3)
    cpu = _estimate(_spec(precision="fp32"), BUILTIN_SHAPES["tiny-llama"], device="cpu")
    assert cpu.gpus == 0 and cpu.gpu_hours == 0


def test_rows_and_tokens_by_objective():
    shape = BUILTIN_SHAPES["tiny-llama"]
    kw = {"file_bytes": 1850 * 30, "records": 30}  # 1,850 bytes a record
    # a preference row: 2 + 1850 × 2/3 ÷ 1.85 = 668.7 → 669 tokens; capped at max_length 512
    assert row_tokens(_spec(max_length=4096), "preference", 1850 * 30, 30) == 669
    dpo = _estimate(_spec(max_steps=None), shape, **kw)
    assert dpo.steps == 3 and dpo.tokens_per_step == 16 * 512  # 30 pairs, batch 8: 3 steps
    kto = _estimate(_spec(objective="kto", max_steps=None), shape, **kw)
    # KTO splits each pair into 2 examples (60): 7 steps of 8, each example with its KL row
    assert kto.examples == 60 and kto.steps == 7 and kto.tokens_per_step == 16 * 512
    unpaired = row_tokens(_spec(objective="kto", max_length=4096), "unpaired", 1850, 1)
    assert unpaired == 1002  # 2 + 1850 ÷ 1.85: one completion, the whole record
    grpo = _estimate(_spec(objective="grpo", max_steps=None), shape, **kw)
    assert grpo.tokens_per_step == 8 * 512  # offline: groups of 2, batch 8 sequences


def test_online_jobs_price_sampling():
    online = _spec(
        objective="grpo", variant="online", batch_size=16, max_steps=10,
        online={"num_samples": 8, "max_new_tokens": 128},
    )  # fmt: skip
    est = _estimate(online, ONE_B, file_format="prompt", file_bytes=100 * 30, records=30)
    # 2 prompts a step (16 sequences in groups of 8), 8 samples of up to 128 tokens each
    assert est.sampled_tokens == 10 * 2 * 8 * 128
    assert est.sampling_seconds > 0 and 0 < est.sampling_share < 1
    assert est.wall_clock_seconds == pytest.approx(
        est.startup_seconds + est.train_seconds + est.sampling_seconds, abs=1e-2
    )


def test_every_device_row_has_its_figures():
    for name, row in throughput_table()["devices"].items():
        assert row["peak_flops"] > 0 and 0 < row["hfu"] <= 1, name
        assert row["startup_seconds"] >= 0 and row["source"], name


def test_sft_scores_one_row_an_example_and_runs_no_reference():
    """SFT: one sequence an example, and no reference forward (JobSpec.needs_reference): at
    the same rows a step, its FLOPs a token are DPO's less the 2N (+ attention) forward."""
    sft = _estimate(_spec(objective="sft", batch_size=16), ONE_B, file_format="sft")
    dpo = _estimate(_spec(batch_size=8), ONE_B)  # 8 pairs: the same 16 rows a step
    assert sft.tokens_per_step == dpo.tokens_per_step == 16 * 512
    n, attention = ONE_B.params, 12.0 * ONE_B.num_layers * ONE_B.hidden_size * 512
    ratio = (6 * n + attention) / (8 * n + attention * 4 / 3)
    assert sft.train_seconds == pytest.approx(dpo.train_seconds * ratio, rel=1e-3)


def test_an_offline_job_counts_tokenizing_its_whole_file():
    """Issue 37 #2: the file is tokenized before step 1, so a `max_steps: 1` job on a large
    file is not priced as one step."""
    spec = _spec(objective="sft", max_steps=1)
    big = _estimate(spec, ONE_B, file_format="sft", file_bytes=500 * 10**6, records=10**5)
    small = _estimate(spec, ONE_B, file_format="sft", file_bytes=5 * 10**6, records=10**3)
    assert big.tokenize_seconds == pytest.approx(500) and small.tokenize_seconds == 5
    assert big.wall_clock_seconds == pytest.approx(
        big.startup_seconds + big.tokenize_seconds + big.train_seconds, abs=1e-3
    )
    online = _estimate(
        _spec(objective="grpo", variant="online", batch_size=8), ONE_B, file_format="prompt"
    )
    assert online.tokenize_seconds == 0  # prompts only, read as sampled
