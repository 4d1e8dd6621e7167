"""Per-token log-probabilities of completion tokens."""

from __future__ import annotations

import torch

from trainer.tokenize import TokenBatch


def token_logps(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """[N, T] log π(token) at the batch's kept positions (zero where the mask is zero).

    `logits_to_keep` makes the model project only the kept positions onto the vocabulary;
    gather − logsumexp avoids materialising a second [N, T, V] tensor for log_softmax.
    A batch with a shared prefix runs in two passes (trainer.tokenize.SharedPrefix).
    """
    device = next(model.parameters()).device
    attention_mask = batch.attention_mask.to(device)
    extra = {}
    if (prefix := batch.prefix) is not None:
        index, prefix_mask = prefix.index.to(device), prefix.attention_mask.to(device)
        cache = model(
            input_ids=prefix.input_ids.to(device),
            attention_mask=prefix_mask,
            use_cache=True,
            logits_to_keep=1,  # the prefix predicts nothing we score
        ).past_key_values
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
    labels = batch.labels.to(device)
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    lp = picked - torch.logsumexp(logits, dim=-1)
    return lp * batch.mask.to(device)
