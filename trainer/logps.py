"""Per-token log-probabilities of completion tokens."""

from __future__ import annotations

import torch

from trainer.tokenize import TokenBatch


def token_logps(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """[N, T] log π(token) at the batch's kept positions (zero where the mask is zero).

    `logits_to_keep` makes the model project only the kept positions onto the vocabulary;
    gather − logsumexp avoids materialising a second [N, T, V] tensor for log_softmax.
    """
    device = next(model.parameters()).device
    out = model(
        input_ids=batch.input_ids.to(device),
        attention_mask=batch.attention_mask.to(device),
        logits_to_keep=batch.positions.to(device),
        use_cache=False,
    )
    logits = out.logits.float()
    labels = batch.labels.to(device)
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    lp = picked - torch.logsumexp(logits, dim=-1)
    return lp * batch.mask.to(device)
