"""A step's metrics, from the device to the host once per optimizer step.

Each loss returns detached 0-d tensors (trainer.losses.types.detached); the step sums its
micro-batches' on the device, and this module averages them over the ranks and copies them to
the host with the gradient norm in one transfer: one device sync per step, not one per
micro-batch per metric (a blocking copy makes the CPU wait for the GPU to drain, and the GPU
then idles while the CPU queues the next micro-batch).
"""

from __future__ import annotations

import torch
from accelerate.utils import gather_object

STOP = "stop_requested"  # not a metric: how many ranks saw a STOP file (the run pops it)


def reduce_step_metrics(
    accelerator, sums: dict[str, torch.Tensor], grad_norm: torch.Tensor, stop: bool = False
) -> dict[str, float]:
    """Every rank's metrics averaged where they exist (a metric may exist on some ranks only:
    KTO's rewards/chosen needs a desirable example), plus `grad_norm`, on the host; and under
    STOP the ranks that saw a stop request, so all of them agree on stopping in the same
    transfer."""
    device, world = accelerator.device, accelerator.num_processes
    keys = sorted(set().union(*gather_object([sorted(sums)]))) if world > 1 else sorted(sums)
    # [name, (sum, 1 where this rank has it)], then [the stop request, 0], reduced over ranks
    local = torch.zeros((len(keys) + 1, 2), device=device)
    for i, name in enumerate(keys):
        if name in sums:
            local[i, 0], local[i, 1] = sums[name], 1.0
    local[-1, 0] = float(stop)
    reduced = accelerator.reduce(local, "sum") if world > 1 else local
    norm = grad_norm.detach().float().reshape(1).to(device)
    *pairs, stops, _, norm_value = torch.cat([reduced.reshape(-1), norm]).tolist()
    metrics = {name: pairs[2 * i] / pairs[2 * i + 1] for i, name in enumerate(keys)}
    metrics["grad_norm"] = norm_value
    metrics[STOP] = stops
    return metrics
