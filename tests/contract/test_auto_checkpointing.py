"""`activation_checkpointing: auto` on the calibration shapes (contract/memory_calibration.json,
measured on an H200): at an 80 GB GPU's memory it leaves checkpointing off once the micro-batch
that fits without it holds AUTO_UNCHECKPOINTED_TOKENS tokens per device, though checkpointing
would fit a micro-batch twice as large (issue 38: that only adds 33 % compute for a full
fine-tune, 50 % for LoRA, on a GPU whose GEMMs are already saturated), and still turns it on
where the unchecked micro-batch is too small."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.memory import GiB, ModelShape
from contract.micro_batch import AUTO_UNCHECKPOINTED_TOKENS, choose_micro_batch
from contract.spec import JobSpec

CALIBRATION = json.loads(
    (Path(__file__).resolve().parents[2] / "contract" / "memory_calibration.json").read_text()
)
SHAPES = {name: ModelShape(**shape) for name, shape in CALIBRATION["shapes"].items()}
H100 = int(79.6 * GiB)  # what torch sees of an H100 80GB HBM3


def job(**kw) -> JobSpec:
    base = {"base_model": "x", "training_file": "f", "objective": "dpo"}
    base |= {"variant": "offline+humanline", "precision": "bf16"}
    return JobSpec.model_validate({**base, **kw})


LORA_8B = job(adapter={"kind": "lora", "r": 16}, batch_size=8, max_prompt_length=512,
              max_length=1024)  # fmt: skip
FULL_1B_LONG = job(batch_size=4, max_prompt_length=512, max_length=2560)


@pytest.mark.parametrize(
    ("name", "spec", "shape", "micro", "tokens"),
    [
        # 4 pairs = 8 rows × 1024 tokens without checkpointing (61 GiB); 8 pairs with it
        ("8b-lora-8x(512+512)", LORA_8B, "llama-3.1-8b", 4, 8192),
        # 2 pairs = 4 rows × 2560 tokens without checkpointing (48 GiB); 4 pairs with it
        ("1.24b-full-4x(512+2048)", FULL_1B_LONG, "llama-3.2-1b", 2, 10240),
    ],
)
def test_auto_leaves_checkpointing_off_where_the_micro_batch_fills_the_gpu(
    name, spec, shape, micro, tokens
):
    chosen = choose_micro_batch(spec, SHAPES[shape], H100, device="cuda")
    on = choose_micro_batch(
        spec.model_copy(update={"activation_checkpointing": "on"}), SHAPES[shape], H100,
        device="cuda",
    )  # fmt: skip
    assert on.fits and on.micro_examples == 2 * micro  # what checkpointing would have bought
    assert chosen.fits and not chosen.activation_checkpointing, chosen.reason
    assert chosen.micro_examples == micro and chosen.rows * spec.max_length == tokens
    assert tokens >= AUTO_UNCHECKPOINTED_TOKENS
    assert chosen.estimate.gib < 79.6 * 0.9


def test_auto_still_checkpoints_a_micro_batch_too_small_to_fill_the_gpu():
    """The 1.24 B long-sequence job at 40 GiB: 1 pair without checkpointing (2 × 2560 = 5,120
    tokens, below the threshold), 4 with it: on."""
    chosen = choose_micro_batch(FULL_1B_LONG, SHAPES["llama-3.2-1b"], 40 * GiB, device="cuda")
    off = choose_micro_batch(
        FULL_1B_LONG.model_copy(update={"activation_checkpointing": "off"}),
        SHAPES["llama-3.2-1b"], 40 * GiB, device="cuda",
    )  # fmt: skip
    assert off.micro_examples * 2 * 2560 < AUTO_UNCHECKPOINTED_TOKENS
    assert chosen.activation_checkpointing and chosen.micro_examples > off.micro_examples
