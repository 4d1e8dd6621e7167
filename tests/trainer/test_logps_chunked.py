"""Chunked log-probs (trainer.chunked_logps) equal the full-logits path and never hold its logits.

The oracles are independent: a plain fp32 log_softmax + gather for the autograd Function, and
token_logps under `full_logits()` (the pre-chunking path: the model's own head, [N, T, V] fp32)
for the trainer's scoring of real models: full fine-tuning, LoRA, tied and untied heads, the
shared-prefix and plain layouts, temperature ≠ 1 and KTO's aux rows. The chunk budget is
shrunk so every case runs several chunks.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import LlamaConfig, LlamaForCausalLM

import trainer.chunked_logps as chunked
from contract.memory import BUILTIN_SHAPES
from tests.trainer.conftest import moved_policy
from tests.trainer.test_logps import PAD, _seqs
from trainer.chunked_logps import chunked_logps
from trainer.logps import batch_logps, full_logits, token_logps
from trainer.tokenize import TokenSeq, collate


def _oracle(h, w, labels, temperature):
    return torch.log_softmax((h @ w.T) / temperature, dim=-1).gather(-1, labels[..., None])[..., 0]


def _grads(fn, h, w, g):
    """fn's value and the gradients of <fn, g> with respect to h and w (None if not required)."""
    h, w = h.detach().requires_grad_(h.requires_grad), w.detach().requires_grad_(w.requires_grad)
    value = fn(h, w)
    (value * g).sum().backward()
    return value.detach(), h.grad, w.grad


def _inputs(m=37, hidden=16, vocab=101, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(m, hidden, generator=gen)
    w = torch.randn(vocab, hidden, generator=gen) * 0.5
    labels = torch.randint(0, vocab, (m,), generator=gen)
    return h, w, labels, torch.randn(m, generator=gen)


@pytest.mark.parametrize("keep", [False, True], ids=["recompute", "keep-softmax"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [5, 37, 100])  # smaller than, equal to, larger than 37 tokens
def test_function_matches_log_softmax_values_and_grads(temperature, chunk, keep):
    h, w, labels, g = _inputs()
    h.requires_grad_(), w.requires_grad_()
    ours = _grads(lambda h, w: chunked_logps(h, w, labels, temperature, chunk, keep), h, w, g)
    ref = _grads(lambda h, w: _oracle(h, w, labels, temperature), h, w, g)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_function_keeps_leading_dims():
    h, w, labels, _ = _inputs(m=24)
    lp = chunked_logps(h.view(4, 6, -1), w, labels.view(4, 6), 0.7, chunk=5)
    torch.testing.assert_close(lp, _oracle(h, w, labels, 0.7).view(4, 6), rtol=1e-5, atol=1e-5)


MATMULS = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_)


class _Largest(TorchDispatchMode):
    """Counts matmuls and records the largest tensor any op returns (bytes)."""

    def __init__(self):
        super().__init__()
        self.matmuls, self.largest = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in MATMULS:
            self.matmuls += 1
        sizes = [t.numel() * t.element_size() for t in tree_leaves(out) if torch.is_tensor(t)]
        self.largest = max([self.largest, *sizes])
        return out


def test_frozen_weight_gets_no_gradient_and_no_gradient_work():
    h, w, labels, g = _inputs()
    h.requires_grad_()
    with _Largest() as probe:
        ours = _grads(lambda h, w: chunked_logps(h, w, labels, 0.7, chunk=10), h, w, g)
    ref = _grads(lambda h, w: _oracle(h, w, labels, 0.7), h, w, g)
    assert ours[2] is None
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-5, atol=1e-5)
    # 4 chunks: one projection forward, then a re-projection and grad_h each; no grad_W matmul
    assert probe.matmuls == 4 * 3


@pytest.mark.parametrize("frozen", [False, True])
def test_a_kept_softmax_saves_the_backward_projection(frozen):
    """keep_softmax: backward re-projects nothing (the full path's matmul count), and the
    softmax it keeps is consumed by the one backward; under no_grad nothing is kept."""
    h, w, labels, g = _inputs()
    h.requires_grad_(), w.requires_grad_(not frozen)
    with _Largest() as probe:
        ours = _grads(lambda h, w: chunked_logps(h, w, labels, 0.7, 10, True), h, w, g)
    ref = _grads(lambda h, w: _oracle(h, w, labels, 0.7), h, w, g)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # 4 chunks: forward's projection, then grad_h (and grad_W when the head trains)
    assert probe.matmuls == 4 * (2 if frozen else 3)
    with torch.no_grad(), _Largest() as probe:
        chunked_logps(h, w, labels, 0.7, 10, True)
    assert probe.matmuls == 4


def test_trainer_sets_the_heads_backward_from_the_estimate():
    """trainer.logps.keep_softmax flags the output layer; chunked scoring passes the flag on
    (a recompute would show as one more projection per chunk)."""
    from trainer.logps import keep_softmax

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1))  # fmt: skip
    batch = collate([TokenSeq((1, 5, 6), (7, 8, 9))], pad_id=0)
    counts = {}
    for on in (False, True):
        keep_softmax(model, on)
        with _Largest() as probe:
            token_logps(model, batch).sum().backward()
        counts[on] = probe.matmuls
    assert counts[False] - counts[True] == 1  # one chunk: its re-projection is gone


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("case", ["fp32-master", "bf16-frozen-base"])
def test_bf16_autocast_within_1e_2_of_fp32(case):
    h, w, labels, g = _inputs(m=50, hidden=32, vocab=300)
    ref = _grads(lambda h, w: _oracle(h, w, labels, 0.7), h.requires_grad_(), w.requires_grad_(), g)
    if case == "bf16-frozen-base":  # LoRA: bf16 base weight, no gradient for it
        h, w = h.bfloat16(), w.detach().bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = _grads(lambda h, w: chunked_logps(h, w, labels, 0.7, chunk=16), h, w, g)
    assert ours[0].dtype == torch.float32  # log-probs in fp32 whatever the matmul dtype
    assert ours[1].dtype == h.dtype
    assert _rel(ours[0], ref[0]) < 1e-2 and _rel(ours[1], ref[1]) < 1e-2
    if case == "fp32-master":
        assert ours[2].dtype == torch.float32 and _rel(ours[2], ref[2]) < 1e-2
    else:
        assert ours[2] is None


# --- token_logps on real models, against full_logits() ---------------------------------------


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch):
    """7 tokens per chunk at tiny-llama's 512-word vocabulary: every batch spans several chunks."""
    monkeypatch.setattr(chunked, "MIN_CHUNK", 1)
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 7 * 512 * 4)
    assert chunked.chunk_tokens(512) == 7


def _untied() -> torch.nn.Module:
    torch.manual_seed(0)
    shape = {**BUILTIN_SHAPES["tiny-llama"].llama_config(), "tie_word_embeddings": False}
    return LlamaForCausalLM(LlamaConfig(**shape))


MODELS = {
    "full-tied": lambda: moved_policy(kind="none"),
    "lora": lambda: moved_policy(kind="lora", r=4, alpha=8),
    "full-untied": _untied,
}


def _score(model, batch, temperature, scorer=token_logps):
    """Log-probs and every trainable weight's gradient of a loss weighing each token apart."""
    model.zero_grad(set_to_none=True)
    lp = scorer(model, batch, temperature)
    weights = torch.linspace(0.5, 1.5, lp.numel()).view(lp.shape)
    (lp * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return lp.detach(), grads


def _assert_same(ours, full):
    (lp, grads), (lp_full, grads_full) = ours, full
    torch.testing.assert_close(lp, lp_full, rtol=1e-5, atol=1e-5)
    assert grads.keys() == grads_full.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], grads_full[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("share", [True, False], ids=["shared-prefix", "plain"])
@pytest.mark.parametrize("kind", list(MODELS))
def test_token_logps_equals_full_logits(kind, share, temperature):
    model = MODELS[kind]()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == (kind != "full-untied")
    batch = collate(_seqs(), PAD, share_prompts=share)
    assert (batch.prefix is not None) is share
    ours = _score(model, batch, temperature)
    with full_logits():
        full = _score(model, batch, temperature)
    _assert_same(ours, full)
    with torch.no_grad():  # the reference's and the lookahead's scoring
        torch.testing.assert_close(token_logps(model, batch, temperature), ours[0], rtol=0, atol=0)


def test_batch_logps_with_aux_rows_equals_full_logits():
    model = moved_policy(kind="none")
    seqs = _seqs()
    aux = collate([TokenSeq(s.prompt_ids, seqs[-1 - i].completion_ids) for i, s in enumerate(seqs)],
                  PAD)  # fmt: skip
    batch = dataclasses.replace(collate(seqs, PAD), aux=aux)
    ours = _score(model, batch, 0.7, batch_logps)
    with full_logits():
        full = _score(model, batch, 0.7, batch_logps)
    assert ours[0].shape[0] == 2 * len(seqs)
    assert ours[0][len(seqs) :].abs().sum() > 0  # the aux rows were scored
    _assert_same(ours, full)


def test_a_head_chunking_cannot_replace_falls_back_to_full_logits():
    model = moved_policy(kind="lora", r=4, alpha=8, target_modules=["q_proj", "lm_head"])
    batch = collate(_seqs(), PAD)
    with pytest.warns(UserWarning, match="full"):
        ours = _score(model, batch, 1.0)
    with full_logits(), warnings.catch_warnings():
        warnings.simplefilter("error")  # the oracle path asks nothing of the head
        full = _score(model, batch, 1.0)
    _assert_same(ours, full)


def test_a_model_that_changes_its_head_output_is_refused():
    model = moved_policy(kind="none")

    def soft_cap(module, args, out):
        out.logits = 30 * torch.tanh(out.logits / 30)
        return out

    model.register_forward_hook(soft_cap)
    with pytest.raises(RuntimeError, match="changes its output layer"):
        token_logps(model, collate(_seqs(), PAD, share_prompts=False))
    assert "forward" not in model.get_output_embeddings().__dict__  # the head was restored


# --- memory ------------------------------------------------------------------------------------


def test_chunked_scoring_never_holds_rows_tokens_vocab(monkeypatch):
    """Forward + backward of token_logps: the largest tensor any op returns stays far below the
    [N, T, V] fp32 logits (which the same probe sees on the full-logits path)."""
    vocab = 8192
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 32 * vocab * 4)  # 32 tokens per chunk
    torch.manual_seed(0)
    shape = {**BUILTIN_SHAPES["tiny-llama"].llama_config(), "vocab_size": vocab}
    model = LlamaForCausalLM(LlamaConfig(**shape))
    gen = torch.Generator().manual_seed(1)
    seqs = [
        TokenSeq(tuple(torch.randint(3, vocab, (8,), generator=gen).tolist()),
                 tuple(torch.randint(3, vocab, (64,), generator=gen).tolist()))
        for _ in range(16)
    ]  # fmt: skip
    batch = collate(seqs, PAD, share_prompts=False)
    logits_bytes = batch.labels.numel() * vocab * 4  # 16 x 64 x 8192 x 4 = 32 MiB

    def largest() -> int:
        with _Largest() as probe:
            token_logps(model, batch).sum().backward()
        return probe.largest

    with full_logits():
        assert largest() >= logits_bytes  # the probe sees the logits where they exist
    assert largest() <= logits_bytes / 8  # chunks (1 MiB) and [V, H] weights (2 MiB) at most


def test_only_completion_tokens_reach_the_output_layer(monkeypatch):
    """Padding and the positions before a row's completion are never projected onto the
    vocabulary: the head sees exactly the mask's tokens, and the values still equal the
    full-logits path's."""
    import trainer.logps as logps

    seen: list[int] = []
    real = logps.chunked_logps

    def recording(h, weight, labels, temperature=1.0, chunk=None, keep_softmax=False):
        seen.append(h.shape[0])
        return real(h, weight, labels, temperature, chunk, keep_softmax)

    monkeypatch.setattr(logps, "chunked_logps", recording)
    model = moved_policy(kind="none")
    for share in (True, False):  # unequal lengths: both layouts pad
        batch = collate(_seqs(), PAD, share_prompts=share)
        seen.clear()
        with torch.no_grad():
            ours = token_logps(model, batch)
            with full_logits():
                full = token_logps(model, batch)
        assert seen == [int(batch.mask.sum())] < [batch.mask.numel()]
        torch.testing.assert_close(ours, full, rtol=0, atol=1e-5)
