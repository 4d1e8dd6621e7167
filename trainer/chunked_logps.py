"""Log-probs of chosen tokens from hidden states, without ever holding every token's logits.

`chunked_logps(h, weight, labels, temperature)` equals
``log_softmax((h @ weight.T).float() / temperature).gather(labels)`` (the full-logits path), but
projects `chunk` tokens at a time: a chunk's fp32 logits are at most `CHUNK_BYTES`, so at a
128k vocabulary the head costs ~256 MiB of scratch instead of ~0.5 MB per token kept (and
about three times that in backward). Backward projects each chunk again (one extra head
matmul, the price of not saving the logits: 2·M·H·V more FLOPs, +1/3 of the head's) and forms
grad_logits = g · (onehot(label) − softmax) / T from the saved per-token logsumexp.

`keep_softmax=True` trades that recompute for memory: forward keeps each chunk's fp32 softmax
(the buffer it already computed, normalised in place) and backward forms the gradient in it,
so the head costs the full path's three matmuls, not four. The trainer asks for it only where
the softmax is small beside the layers' saves and checkpointing is off
(contract.memory.keeps_softmax); a no-grad forward (the reference) never keeps anything.

A chunk spans the whole vocabulary: its logsumexp is one fp32 reduction, so no online
logsumexp over vocabulary pieces is needed until a vocabulary alone exceeds the budget at
`MIN_CHUNK` tokens (64 tokens at 1M words: 256 MiB; no model we serve comes near).

Precision follows torch.autocast the way ``nn.Linear`` does: the matmuls run in the autocast
dtype (h and the weight cast per call; an fp32 master weight is cast once per call, like
autocast's cache), the logits are upcast to fp32 for the softmax, and the weight's gradient is
summed over chunks in fp32 and returned in the weight's dtype. A weight that does not require
grad (a LoRA base's head) gets no gradient work at all.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

CHUNK_BYTES = 256 * 2**20  # fp32 logits per chunk: small beside a GPU, big enough for a fast GEMM
MIN_CHUNK = 64  # tokens: below this a huge vocabulary would make the matmuls too thin


def chunk_tokens(vocab: int) -> int:
    """Tokens per chunk: as many as keep one chunk's fp32 logits within CHUNK_BYTES."""
    return max(MIN_CHUNK, CHUNK_BYTES // (4 * vocab))


def chunked_logps(
    h: Tensor,
    weight: Tensor,
    labels: Tensor,
    temperature: float = 1.0,
    chunk: int | None = None,
    keep_softmax: bool = False,
) -> Tensor:
    """log softmax(h @ weight.T / temperature)[label] per token: h [..., H], weight [V, H],
    labels [...] (int64) -> [...] fp32. `chunk` tokens are projected at a time (default from
    `CHUNK_BYTES`); `keep_softmax` keeps their softmax for backward instead of recomputing."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if h.shape[:-1] != labels.shape:
        shapes = f"{tuple(h.shape)} and {tuple(labels.shape)}"
        raise ValueError(f"hidden states and labels do not match: {shapes}")
    if chunk is None:
        chunk = chunk_tokens(weight.shape[0])
    # Only a forward that builds a graph has a backward to keep the softmax for. Decided here:
    # inside forward grad mode is always off, and ctx.needs_input_grad reports the inputs'
    # requires_grad even under no_grad (a reference, KTO's mismatched rows, data scoring).
    keep_softmax = keep_softmax and torch.is_grad_enabled()
    keep_softmax = keep_softmax and (h.requires_grad or weight.requires_grad)
    return _ChunkedLogps.apply(h, weight, labels, float(temperature), int(chunk), keep_softmax)


def _compute_dtype(h: Tensor, weight: Tensor) -> torch.dtype:
    """The matmul dtype nn.Linear would use here: autocast's if it is on, else the inputs'."""
    device = h.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(h.dtype, weight.dtype)


def _logits(h: Tensor, w: Tensor, temperature: float) -> Tensor:
    """[m, V] fp32 logits of one chunk (h, w already in the compute dtype)."""
    logits = (h @ w.T).float()
    if temperature != 1.0:
        logits.div_(temperature)
    return logits


def _logsumexp_(logits: Tensor) -> Tensor:
    """torch.logsumexp over the last dim, overwriting `logits` instead of allocating a second
    chunk-sized buffer for the exponentials (halves the forward's scratch)."""
    top = logits.amax(dim=-1, keepdim=True)
    return logits.sub_(top).exp_().sum(dim=-1).log_().add_(top[:, 0])


class _ChunkedLogps(torch.autograd.Function):
    """h [..., H], weight [V, H], labels [...] -> [...] fp32 log-probs; saves h, weight, labels
    and the logsumexp. Works on flat [M, H] views inside and returns a fresh tensor, not a view
    (FSDP2 warns about a module returning views: an in-place op on one skips its hooks)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        h: Tensor,
        weight: Tensor,
        labels: Tensor,
        temperature: float,
        chunk: int,
        keep_softmax: bool,
    ) -> Tensor:
        dtype = _compute_dtype(h, weight)
        keep = keep_softmax  # and a graph is being built (chunked_logps)
        kept: list[Tensor] = []  # each chunk's softmax, when kept
        out = torch.empty(labels.shape, dtype=torch.float32, device=h.device)
        picked, lse = out.view(-1), torch.empty(labels.numel(), device=h.device)
        flat_h, flat_labels = h.reshape(-1, h.shape[-1]), labels.reshape(-1)
        with torch.autocast(h.device.type, enabled=False):
            w = weight.to(dtype)
            for s in range(0, flat_h.shape[0], chunk):
                logits = _logits(flat_h[s : s + chunk].to(dtype), w, temperature)
                picked[s : s + chunk] = logits.gather(1, flat_labels[s : s + chunk, None])[:, 0]
                lse[s : s + chunk] = _logsumexp_(logits)
                if keep:  # logits now holds exp(x - max): normalised in place, the softmax
                    kept.append(logits.div_(logits.sum(dim=-1, keepdim=True)))
        ctx.save_for_backward(h, weight, flat_labels, lse, *kept)
        ctx.temperature, ctx.chunk, ctx.dtype = temperature, chunk, dtype
        picked.sub_(lse)
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        (g,) = grads
        h_in, weight, labels, lse, *kept = ctx.saved_tensors
        h = h_in.reshape(-1, h_in.shape[-1])
        need_h, need_w = ctx.needs_input_grad[:2]
        temperature, chunk, dtype = ctx.temperature, ctx.chunk, ctx.dtype
        grad_h = torch.empty_like(h) if need_h else None
        # fp32 sum over chunks (one [V, H] buffer), cast to the weight's dtype once at the end
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if need_w else None
        scale = g.reshape(-1).float() / temperature  # d(logits / T) / d logits = 1 / T
        with torch.autocast(h.device.type, enabled=False):
            w = weight.to(dtype)
            for i, s in enumerate(range(0, h.shape[0], chunk)):
                hs = h[s : s + chunk].to(dtype)
                e = s + hs.shape[0]
                # in place: softmax (kept, or recomputed), then −g·softmax/T, then +g/T at the
                # label (a kept softmax is consumed: this backward is the graph's only one)
                if kept:
                    grad = kept[i]
                else:
                    grad = _logits(hs, w, temperature).sub_(lse[s:e, None]).exp_()
                grad.mul_(-scale[s:e, None])
                grad.scatter_add_(1, labels[s:e, None], scale[s:e, None])
                grad = grad.to(dtype)
                if grad_h is not None:
                    grad_h[s:e] = grad @ w
                if grad_w is not None and dtype == torch.float32:
                    grad_w.addmm_(grad.T, hs)  # no [V, H] temporary
                elif grad_w is not None:
                    grad_w.add_(grad.T @ hs)
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        if grad_h is not None:
            grad_h = grad_h.view(h_in.shape)
        return grad_h, grad_w, None, None, None, None
