"""benchmarks/gpu_scale.py's arithmetic, checked by hand: the GPU-busy share (overlapping
streams count once), the FLOPs MFU and HFU divide by, and where the chosen micro-batch is read.
(The part itself runs on tiny shapes in tests/benchmarks/test_gpu_smoke.py's self-check.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_scale  # noqa: E402 - benchmarks/ is on sys.path only from the line above
from gpu_models import EIGHT_B_SHAPE, ONE_B_SHAPE  # noqa: E402


def _event(start_us: float, end_us: float):
    return SimpleNamespace(time_range=SimpleNamespace(start=start_us, end=end_us))


def test_busy_share_counts_overlapping_kernels_once():
    # two streams overlap on [5, 10); one kernel lies inside another; a gap [15, 20)
    events = [_event(0, 10), _event(5, 15), _event(6, 7), _event(20, 30)]
    assert gpu_scale.busy_share(events, wall_s=40e-6) == 25 / 40
    assert gpu_scale.busy_share([], wall_s=1.0) == 0.0


def test_flops_per_token_by_hand():
    layers, hidden = ONE_B_SHAPE["num_hidden_layers"], ONE_B_SHAPE["hidden_size"]
    n, seq = 1_235_814_400, 512
    attention = 12 * 16 * 2048 * 512
    assert (layers, hidden) == (16, 2048) and attention == 201_326_592
    model, hw = gpu_scale.flops_per_token(n, ONE_B_SHAPE, seq, lora=False, ckpt=False)
    assert model == 6 * n + attention
    assert hw == model + 2 * n + attention // 3  # the reference/lookahead forward
    lora_model, lora_hw = gpu_scale.flops_per_token(n, ONE_B_SHAPE, seq, lora=True, ckpt=True)
    assert lora_model == 4 * n + attention
    assert lora_hw == lora_model + 2 * (2 * n + attention // 3)  # + checkpointing's recompute


def test_eight_b_shape_is_llama_3_1_8b():
    v, h, i, n = (EIGHT_B_SHAPE[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                             "num_hidden_layers"))  # fmt: skip
    q = EIGHT_B_SHAPE["num_attention_heads"] * EIGHT_B_SHAPE["head_dim"]
    kv = EIGHT_B_SHAPE["num_key_value_heads"] * EIGHT_B_SHAPE["head_dim"]
    assert not EIGHT_B_SHAPE["tie_word_embeddings"]
    per_layer = 2 * h * q + 2 * h * kv + 3 * h * i + 2 * h
    assert 2 * v * h + n * per_layer + h == 8_030_261_248  # Llama-3.1-8B's count


def test_the_chosen_micro_batch_comes_from_the_started_event(tmp_path):
    spec = SimpleNamespace(examples_per_batch=8, grad_accum=None)
    tr = SimpleNamespace(spec=spec)
    assert gpu_scale.chosen(tr, tmp_path) == (8, 1, "spec")  # nothing else to read
    started = {"kind": "started", "message": "", "data": {"grad_accum": 4, "micro_batch": 2}}
    (tmp_path / "events.jsonl").write_text(
        json.dumps({"kind": "progress", "message": "", "data": {}}) + "\n" + json.dumps(started)
    )
    assert gpu_scale.chosen(tr, tmp_path) == (2, 4, "started event")
    tr.memory = SimpleNamespace(micro_examples=1, grad_accum=8)  # trainer.memory's choice
    assert gpu_scale.chosen(tr, tmp_path) == (1, 8, "Trainer.memory")
