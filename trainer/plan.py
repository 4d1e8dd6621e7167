"""Which examples every (step, micro-batch, rank) sees: a pure function of the seed.

Because the order is computable for any future step, the humanline reference can score the
next k batches ahead of time, and a resumed run needs only the step number to continue with
exactly the data it would have seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from trainer.seeds import derive_seed


@dataclass(frozen=True)
class MicroBatch:
    indices: tuple[int, ...]  # dataset indices of this rank's share of the micro-step
    partners: tuple[int, ...]  # the next example of the global batch (KTO's mismatched pairs)


@dataclass(frozen=True)
class BatchPlan:
    n_examples: int
    global_batch: int
    grad_accum: int
    world: int
    rank: int
    seed: int
    total_steps: int

    def __post_init__(self) -> None:
        if self.n_examples < self.global_batch:
            raise ValueError(
                f"the dataset has {self.n_examples} usable training examples, fewer than the "
                f"{self.global_batch} of one batch (batch_size in the objective's units); lower "
                f"batch_size or add data"
            )
        if self.global_batch % (self.grad_accum * self.world):
            raise ValueError(
                f"a batch of {self.global_batch} training examples (batch_size in the objective's "
                f"units, GRPO groups counted once) must be divisible by grad_accum × processes "
                f"({self.grad_accum} × {self.world})"
            )

    @property
    def steps_per_epoch(self) -> int:
        return self.n_examples // self.global_batch

    @property
    def micro_size(self) -> int:
        return self.global_batch // (self.grad_accum * self.world)

    def epoch_of(self, step: int) -> int:
        return (step - 1) // self.steps_per_epoch

    def global_indices(self, step: int) -> list[int]:
        """The global batch of a 1-based step (incomplete epoch tails are dropped)."""
        perm = _permutation(self.n_examples, self.seed, self.epoch_of(step))
        offset = (step - 1) % self.steps_per_epoch * self.global_batch
        return perm[offset : offset + self.global_batch]

    def micro(self, step: int, micro: int) -> MicroBatch:
        batch = self.global_indices(step)
        # A rank's share of the batch is one contiguous block whatever grad_accum is, split
        # into its micro-batches: halving the micro-batch (after an out-of-memory error) only
        # splits each micro-batch in two, and every rank keeps the examples it had.
        start = (self.rank * self.grad_accum + micro) * self.micro_size
        positions = range(start, start + self.micro_size)
        return MicroBatch(
            indices=tuple(batch[p] for p in positions),
            partners=tuple(batch[(p + 1) % len(batch)] for p in positions),
        )


@lru_cache(maxsize=4)
def _permutation(n: int, seed: int, epoch: int) -> list[int]:
    gen = torch.Generator().manual_seed(derive_seed(seed, "plan", epoch))
    return torch.randperm(n, generator=gen).tolist()
