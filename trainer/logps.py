"""Per-token log-probabilities of completion tokens.

`token_logps` scores one batch with autograd as the caller has it; `batch_logps` also scores the
batch's `aux` rows (KTO's mismatched pairs), always without a graph: no loss differentiates
through them, so keeping their activations would only double a step's memory and backward work.

The model never returns its [N, T, V] logits: for the scoring forward its output layer's
forward is swapped for one that turns the hidden states transformers hands it into the labels'
log-probs chunk by chunk (trainer.chunked_logps), so `out.logits` is [N, T] log-probs. Doing it
inside the model's forward is what makes FSDP2 work unchanged: the root's pre-forward hook has
gathered the head's weight, and the weight saved for backward is the unsharded parameter that
FSDP2 re-gathers before backward, exactly as for the nn.Linear it replaces. `full_logits()`
restores the old path (the oracle for tests and benchmarks; training never uses it).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from trainer.chunked_logps import chunked_logps
from trainer.tokenize import TokenBatch

_full = False  # full_logits() in force
_KEEP = "humanline_keep_softmax"  # the output layer's flag (keep_softmax)


@contextmanager
def full_logits() -> Iterator[None]:
    """token_logps materialises the [N, T, V] logits in fp32 as before chunking (an oracle for
    tests and benchmarks: the same values, ~1.3 MB per token at a 128k vocabulary)."""
    global _full
    before, _full = _full, True
    try:
        yield
    finally:
        _full = before


def keep_softmax(model: nn.Module, on: bool) -> None:
    """Whether the chunked head of `model` keeps its softmax for backward instead of projecting
    again (trainer.chunked_logps; the trainer decides it once from contract.memory.
    keeps_softmax). A flag on the output layer, like checkpointing is the layers' own."""
    head = _plain_head(model, quiet=True)
    if head is not None:
        setattr(head, _KEEP, on)


def token_logps(
    model: torch.nn.Module, batch: TokenBatch, temperature: float = 1.0
) -> torch.Tensor:
    """[N, T] log π(token) at the batch's kept positions (zero where the mask is zero).

    `temperature` ≠ 1 scores the tempered distribution softmax(logits / T), the one a sampler
    with that temperature drew from (open-r1-humanline's ``_get_per_token_logps_and_entropies``).

    `logits_to_keep` makes the model project only the kept positions onto the vocabulary;
    gather − logsumexp avoids materialising a second [N, T, V] tensor for log_softmax.
    A batch with a shared prefix runs in two passes (trainer.tokenize.SharedPrefix).
    """
    device = next(model.parameters()).device
    attention_mask = batch.attention_mask.to(device)
    extra = {}
    anchor = None
    if (prefix := batch.prefix) is not None:
        index, prefix_mask = prefix.index.to(device), prefix.attention_mask.to(device)
        out = model(
            input_ids=prefix.input_ids.to(device),
            attention_mask=prefix_mask,
            use_cache=True,
            logits_to_keep=1,  # the prefix predicts nothing we score
        )
        cache = out.past_key_values
        # The prefix pass reaches the loss only through the cache, so without this (zero)
        # term its last layer's output gets no gradient. FSDP re-gathers a layer's weights
        # for backward when its output's gradient arrives; this makes that happen for every
        # layer of the prefix pass (trainer.distributed). Exactly +0.0 to every log-prob.
        anchor = out.logits.sum() * 0.0 if torch.is_grad_enabled() else None
        cache.reorder_cache(index)  # one copy of the prompt's keys and values per row
        attention_mask = torch.cat([prefix_mask[index], attention_mask], dim=1)
        steps = torch.arange(batch.input_ids.shape[1], device=device)
        positions = prefix.lengths.to(device)[:, None] + steps
        extra = {"past_key_values": cache, "position_ids": positions}
    if batch.position_ids is not None:  # packed rows: per-example attention from the positions
        attention_mask = None
        extra = {"position_ids": batch.position_ids.to(device)}
    labels = batch.labels.to(device)
    inputs = {
        "input_ids": batch.input_ids.to(device),
        "attention_mask": attention_mask,
        "logits_to_keep": batch.positions.to(device),
        "use_cache": False,
        **extra,
    }
    head = None if _full else _plain_head(model)
    if head is None:
        lp = _from_logits(model(**inputs).logits, labels, temperature)
    else:
        assert batch.kept is not None  # set by TokenBatch itself
        kept = batch.kept.to(device)
        with _scoring(head, labels, kept, temperature) as scored:
            lp = model(**inputs).logits
        if len(scored) != 1 or lp is not scored[0]:
            raise RuntimeError(
                f"{type(_unwrap(model)).__name__} changes its output layer's result before "
                "returning it (soft-capping, scaling, upcasting?): chunked log-probs would be "
                "wrong for it"
            )
    if anchor is not None:
        lp = lp + anchor
    return lp * batch.mask.to(device)


def _from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """The full-logits path: [N, T, V] upcast to fp32, gather − logsumexp."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _unwrap(model: nn.Module) -> nn.Module:
    """The module under DDP (whose forward calls it)."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return model.module
    return model


def _plain_head(model: nn.Module, quiet: bool = False) -> nn.Linear | None:
    """The model's output layer if chunking can replace it: a bias-free nn.Linear (a PeftModel
    passes get_output_embeddings through to its base). Anything else (a LoRA-adapted head, a
    head with a bias) keeps the full-logits path, with a warning: correct, but ~V·4 bytes per
    token of memory."""
    inner = _unwrap(model)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if isinstance(head, nn.Linear) and head.bias is None:
        return head
    if quiet:
        return None
    warnings.warn(
        f"output layer {type(head).__name__} is not a bias-free nn.Linear: log-probs "
        "materialise the full [rows, tokens, vocabulary] logits",
        stacklevel=3,
    )
    return None


@contextmanager
def _scoring(
    head: nn.Linear, labels: torch.Tensor, kept: torch.Tensor, temperature: float
) -> Iterator[list]:
    """Within the block `head(h)` returns the [N, T] log-probs of `labels` (chunked) instead
    of logits, computed only at the `kept` (flat) positions, zero elsewhere; the yielded list
    receives that result (to check the model returned it as is)."""
    scored: list[torch.Tensor] = []

    def forward(h: torch.Tensor) -> torch.Tensor:
        # head.weight read here, inside the model's forward: FSDP2's unsharded parameter
        flat = h.reshape(-1, h.shape[-1]).index_select(0, kept)
        lp = chunked_logps(
            flat,
            head.weight,
            labels.reshape(-1).index_select(0, kept),
            temperature,
            keep_softmax=getattr(head, _KEEP, False),
        )
        # a fresh [N, T] tensor, not a view (FSDP2 warns about a module returning views)
        where = (kept // labels.shape[1], kept % labels.shape[1])
        scored.append(lp.new_zeros(labels.shape).index_put(where, lp))
        return scored[-1]

    own = head.__dict__.get("forward")  # an instance-level forward someone else set, if any
    head.forward = forward  # type: ignore[method-assign]
    try:
        yield scored
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own


def batch_logps(
    model: torch.nn.Module, batch: TokenBatch, temperature: float = 1.0
) -> torch.Tensor:
    """[N + M, W] log-probs of the batch's rows, then of its `aux` rows (scored under no_grad),
    zero-padded to one width W; `batch.row_mask()` is the matching mask."""
    own = token_logps(model, batch, temperature)
    if batch.aux is None:
        return own
    aux = batch.aux_logps  # scored already, before the step's first loss (trainer.stepwide)
    if aux is None:
        with torch.no_grad():
            aux = token_logps(model, batch.aux, temperature)
    return pad_cat(own, aux)


def pad_cat(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Rows of `a` then rows of `b`, right-padded with zeros to the wider of the two."""
    width = max(a.shape[1], b.shape[1])

    def pad(x):
        return torch.nn.functional.pad(x, (0, width - x.shape[1]))

    return torch.cat([pad(a), pad(b)])
