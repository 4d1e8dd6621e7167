"""SFT: the mean negative log-likelihood of the learned completion tokens."""

from __future__ import annotations

import torch

from trainer.losses.types import LossOutput, detached, masked_mean


def sft_loss(
    pol: torch.Tensor, mask: torch.Tensor, token_normalizer: float | torch.Tensor | None = None
) -> LossOutput:
    """``Σ −log π(y_t) / N`` over the tokens where ``mask`` is set.

    ``pol`` [B, T] per-token log-probs, ``mask`` [B, T] 1 on learned tokens (an assistant turn
    of weight 0, a user turn between assistant turns and padding are 0). N is
    ``token_normalizer`` when given (the trainer passes the learned-token count of the whole
    optimizer batch, across ranks and accumulation steps, per micro-batch: so the step's
    gradient is that of the global batch's token mean, however the batch is split or packed),
    else the local count. Metrics: ``loss``; ``nll/token`` and ``logps/mean`` are this
    micro-batch's own token means.
    """
    keep = mask.bool()
    total = torch.where(keep, -pol, 0.0).sum()
    denom = token_normalizer if token_normalizer is not None else keep.sum().clamp(min=1)
    loss = total / denom
    with torch.no_grad():
        nll = masked_mean(-pol, keep)
        metrics = detached({"loss": loss, "nll/token": nll, "logps/mean": -nll})
    return LossOutput(loss=loss, metrics=metrics)
