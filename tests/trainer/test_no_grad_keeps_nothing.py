"""A forward without a graph keeps nothing for a backward that will never run (issue 38).

The chunked head's keep_softmax holds every chunk's fp32 softmax until backward. Under
torch.no_grad there is no backward, yet `ctx.needs_input_grad` reports the weight's
requires_grad there too, so the full-FT lookahead refresh, KTO's mismatched rows and data
scoring held every chunk's softmax (at SmolLM2's vocabulary 512 MB for 70 MB of chunk). The
probe counts the chunk buffers still alive each time a chunk is projected: one (the chunk being
freed) when nothing is kept, all earlier ones when the softmax is kept.
"""

from __future__ import annotations

import weakref

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import trainer.chunked_logps as chunked
from tests.trainer.test_logps import PAD
from trainer.logps import batch_logps, keep_softmax
from trainer.tokenize import TokenSeq, collate


class _LiveChunks:
    """Wraps chunked_logps' `_logits`: the most chunk buffers alive at once, over the block."""

    def __init__(self, monkeypatch):
        real, self.alive, self.most = chunked._logits, [], 0

        def counting(h, w, temperature):
            self.alive = [r for r in self.alive if r() is not None]
            out = real(h, w, temperature)
            self.alive.append(weakref.ref(out))
            self.most = max(self.most, len(self.alive))
            return out

        monkeypatch.setattr(chunked, "_logits", counting)


def _inputs(m=40, hidden=16, vocab=101):
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(m, hidden, generator=gen, requires_grad=True)
    w = torch.randn(vocab, hidden, generator=gen, requires_grad=True)
    return h, w, torch.randint(0, vocab, (m,), generator=gen)


@pytest.mark.parametrize("frozen_h", [False, True])
def test_a_no_grad_forward_keeps_no_chunk_even_when_asked_to(monkeypatch, frozen_h):
    h, w, labels = _inputs()
    h.requires_grad_(not frozen_h)  # the weight trains (full FT): needs_input_grad says so
    probe = _LiveChunks(monkeypatch)
    with torch.no_grad():
        out = chunked.chunked_logps(h, w, labels, 1.0, chunk=10, keep_softmax=True)
    assert probe.most <= 2  # the new chunk and the one its variable still names, never 4
    probe.most = 0
    with torch.enable_grad():  # the probe sees keeping where it happens: all 4 chunks
        kept = chunked.chunked_logps(h, w, labels, 1.0, chunk=10, keep_softmax=True)
    assert probe.most == 4
    torch.testing.assert_close(out, kept.detach())


def test_kto_mismatched_rows_and_the_reference_keep_nothing(monkeypatch):
    """batch_logps: the graph's rows keep their softmax (keep_softmax on), the aux rows scored
    under no_grad right after keep none; a no-grad scoring of the whole batch keeps none."""
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 4 * 64 * 4)  # 4 tokens a chunk
    monkeypatch.setattr(chunked, "MIN_CHUNK", 1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    keep_softmax(model, True)
    rows = [TokenSeq((1, 5, 6), tuple(range(7, 7 + 8))) for _ in range(2)]  # 16 tokens: 4 chunks
    batch = collate(rows, PAD, share_prompts=False)
    batch.aux = collate(rows, PAD, share_prompts=False)
    probe = _LiveChunks(monkeypatch)
    with torch.no_grad():  # the reference / lookahead scoring of a full fine-tune
        batch_logps(model, batch)
    assert probe.most <= 2
    probe.most, probe.alive = 0, []
    own = batch_logps(model, batch)
    # the graph's 4 kept chunks, plus at most the aux forward's current two
    assert probe.most <= 4 + 2
    own.sum().backward()
