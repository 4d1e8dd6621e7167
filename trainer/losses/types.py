"""What every loss returns, and the one place its metrics become plain floats."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LossOutput:
    """A scalar loss to backpropagate and detached metrics to log.

    ``metrics`` holds detached 0-d tensors on the loss's device (`detached`): the training loop
    averages them there and moves them to the host once per step; ``floats()`` for anyone else.
    """

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)

    def floats(self) -> dict[str, float]:
        """The metrics on the host, with one device sync."""
        return to_floats(dict(self.metrics))


def detached(metrics: dict[str, torch.Tensor | float]) -> dict[str, torch.Tensor]:
    """Detached 0-d fp32 tensors, left where they are: the trainer sums a step's micro-batches
    on the device and copies them to the host once per optimizer step (trainer.train), instead
    of one blocking copy per micro-batch."""
    return {k: torch.as_tensor(v).detach().float().reshape(()) for k, v in metrics.items()}


def to_floats(metrics: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """Detach tensor metrics and move them to the host with a single device sync.

    One ``torch.stack(...).tolist()`` instead of one ``.item()`` per metric: on a GPU every
    ``.item()`` is a blocking sync, and a loss reports half a dozen metrics per step.
    """
    tensors = {k: v for k, v in metrics.items() if isinstance(v, torch.Tensor)}
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, torch.Tensor)}
    if tensors:
        stacked = torch.stack([v.detach().float().reshape(()) for v in tensors.values()])
        out.update(zip(tensors, stacked.cpu().tolist(), strict=True))
    return {k: out[k] for k in metrics}


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is set; 0 (not NaN) for an empty mask."""
    keep = mask.bool()
    return torch.where(keep, x, 0.0).sum() / keep.sum().clamp(min=1).to(x.dtype)
