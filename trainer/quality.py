"""Data-quality signal (DESIGN.md §2): mean token log-prob of the data under π_ref at step 0.

The paper finds offline data helps a humanline run when it is likely enough under the
reference; its lowest quartile, mean token log-prob in [−1.03, −0.36], trained worse. We score
up to `sample` examples' completions, report the distribution and warn when most of the data
sits in that range or below.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from trainer.logps import token_logps
from trainer.tokenize import TokenBatch

LOW_QUARTILE_TOP = -0.36
WARN_FRACTION = 0.5


def data_quality(model: torch.nn.Module, batches: Sequence[TokenBatch]) -> dict:
    values: list[float] = []
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for batch in batches:
            lp = token_logps(model, batch).cpu()
            counts = batch.mask.sum(-1).clamp(min=1)
            values.extend((lp.sum(-1) / counts).tolist())
    model.train(was_training)
    if not values:
        return {"n": 0}
    t = torch.tensor(values)
    q = torch.quantile(t, torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0])).tolist()
    hist, edges = torch.histogram(t, bins=20)
    low = float((t <= LOW_QUARTILE_TOP).float().mean())
    report = {
        "n": len(values),
        "mean": float(t.mean()),
        "quantiles": dict(zip(["min", "q25", "median", "q75", "max"], q, strict=False)),
        "histogram": {"counts": hist.tolist(), "edges": edges.tolist()},
        "fraction_at_or_below_low_quartile": low,
        "low_quartile_top": LOW_QUARTILE_TOP,
        "warning": None,
    }
    if low >= WARN_FRACTION:
        report["warning"] = (
            f"{low:.0%} of sampled completions have mean token log-prob ≤ {LOW_QUARTILE_TOP} "
            "under the reference; the paper found such off-policy data trains worse with "
            "humanline variants. Consider data closer to the model's own distribution."
        )
    return report


def quality_batches(
    n: int, make: Callable[[list[int]], TokenBatch], sample: int, seed: int, size: int = 8
) -> list[TokenBatch]:
    """`sample` examples drawn at random (seeded; all of them when there are fewer) in batches
    of `size`: a file's first lines are often one source or one topic, not the whole file."""
    gen = torch.Generator().manual_seed(seed)
    idx = sorted(torch.randperm(n, generator=gen)[: min(n, sample)].tolist())
    return [make(idx[i : i + size]) for i in range(0, len(idx), size)]
