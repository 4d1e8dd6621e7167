"""Per-token log-probabilities of completion tokens.

`token_logps` scores one batch with autograd as the caller has it; `batch_logps` also scores the
batch's `aux` rows (KTO's mismatched pairs), always without a graph: no loss differentiates
through them, so keeping their activations would only double a step's memory and backward work.
"""

from __future__ import annotations

import torch

from trainer.tokenize import TokenBatch


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
    out = model(
        input_ids=batch.input_ids.to(device),
        attention_mask=attention_mask,
        logits_to_keep=batch.positions.to(device),
        use_cache=False,
        **extra,
    )
    logits = out.logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    labels = batch.labels.to(device)
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    lp = picked - torch.logsumexp(logits, dim=-1)
    if anchor is not None:
        lp = lp + anchor
    return lp * batch.mask.to(device)


def batch_logps(
    model: torch.nn.Module, batch: TokenBatch, temperature: float = 1.0
) -> torch.Tensor:
    """[N + M, W] log-probs of the batch's rows, then of its `aux` rows (scored under no_grad),
    zero-padded to one width W; `batch.row_mask()` is the matching mask."""
    own = token_logps(model, batch, temperature)
    if batch.aux is None:
        return own
    with torch.no_grad():
        aux = token_logps(model, batch.aux, temperature)
    return pad_cat(own, aux)


def pad_cat(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Rows of `a` then rows of `b`, right-padded with zeros to the wider of the two."""
    width = max(a.shape[1], b.shape[1])
    def pad(x):
        return torch.nn.functional.pad(x, (0, width - x.shape[1]))
    return torch.cat([pad(a), pad(b)])
