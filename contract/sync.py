"""The reference-sync policy: the one place that decides when the reference moves.

Every site that asks "is the reference synced now?" asks a :class:`SyncPolicy` (the spec builds
it, see ``JobSpec.sync_policy``): which reference to keep (trainer.reference), when to refresh it
(trainer.train), how far ahead one refresh reaches, and GRPO's default ε (0.5 only when the
reference never moves, DESIGN.md §2). Torch-free, so the API and the trainer share it.

- ``humanline``: every k steps (``step % k == 0``), after backward and clipping, *before*
  ``optimizer.step()``: the reference of steps s+1..s+k is θ_s.
- ``trust_region``: every k steps, *after* the update: the reference of steps s+1..s+k is θ_{s+1}.
- ``none``: never synced offline. An online job's reference is still reset to the policy at every
  round's start (paper, Algorithm 1), so an online reference always moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ReferenceSync = Literal["humanline", "trust_region", "none"]


@dataclass(frozen=True)
class SyncPolicy:
    mode: ReferenceSync
    every: int = 1  # k
    online: bool = False

    @property
    def moves(self) -> bool:
        """Whether the reference ever changes during the run (then it is scored ahead, never
        copied)."""
        return self.online or self.mode != "none"

    @property
    def periodic(self) -> bool:
        return self.mode in ("humanline", "trust_region")

    def before_update(self, step: int) -> bool:
        """Humanline syncing: reference := θ_s before update s."""
        return self.mode == "humanline" and step % self.every == 0

    def after_update(self, step: int) -> bool:
        """Trust-region syncing: reference := θ_{s+1} after update s."""
        return self.mode == "trust_region" and step % self.every == 0

    def reach(self, step: int, segment_end: int) -> int:
        """The last step a reference made at `step` serves: the next sync point, or the end of
        the current data segment (the run offline, the round online), whichever comes first."""
        if self.periodic:
            return min(segment_end, (step // self.every + 1) * self.every)
        return segment_end
