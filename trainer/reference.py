"""Where reference log-probs come from. The choice is made once, in `make_reference`.

- `none` with LoRA: the base model with the adapter switched off (torchtune's way): no copy.
- `none` with full fine-tuning: a frozen copy of the initial weights (what every DPO
  implementation keeps; the cost offline training always pays).
- `humanline` / `trust_region`, and every online run (any adapter): no reference model at all.
  At a sync point the reference becomes the current weights, and the reference is only ever
  *used* on the next k batches, whose order is known (trainer.plan). So at the sync point we
  score those k batches
  with the current weights and keep just their per-token log-probs. Humanline calls `refresh`
  before `optimizer.step()` (reference = θ_s for steps s+1..s+k), trust-region after it. The
  cost is the one no-grad forward per batch that any reference costs, moved earlier; the
  memory is k batches of log-probs instead of a second model; a "sync" copies nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ClassVar, Protocol

import torch

from contract.sync import SyncPolicy
from trainer.logps import batch_logps
from trainer.tokenize import TokenBatch

BatchFn = Callable[[int, int], TokenBatch]  # (step, micro) -> this rank's micro-batch


class Reference(Protocol):
    def logps(self, step: int, micro: int, batch: TokenBatch) -> torch.Tensor: ...
    def refresh(self, step: int, until: int) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


def _noisy(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules whose training mode changes what a forward computes: dropout the load left
    on (only LoRA's explicit `adapter.dropout`; every model dropout is zeroed at load, so
    `train()` and `eval()` are otherwise the same function, trainer.modeling.policy)."""
    return [
        m for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0
    ]


@contextmanager
def _scoring(noisy: list[torch.nn.Module]) -> Iterator[None]:
    """No grad, no dropout; restores the training mode afterwards. Only `noisy` (see _noisy)
    is switched: `model.eval()` and back walks every module in Python, which cost 3-4 % of a
    SmolLM2-shape humanline step on an H100, 7-9 % with LoRA (docs/deploy.md)."""
    modes = [m.training for m in noisy]
    for m in noisy:
        m.train(False)
    try:
        with torch.no_grad():
            yield
    finally:
        for m, mode in zip(noisy, modes, strict=True):
            m.train(mode)


class _Fixed:
    """A reference that never moves: nothing to sync, nothing to checkpoint."""

    name: ClassVar[str]  # in the error a sync attempt raises

    def refresh(self, step: int, until: int) -> None:
        raise RuntimeError(f"{self.name} reference is never synced")

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class FrozenCopy(_Fixed):
    name = "a frozen"

    def __init__(
        self,
        model: torch.nn.Module,
        temperature: float = 1.0,
        copy_model: Callable[[torch.nn.Module], torch.nn.Module] = copy.deepcopy,
    ):
        self.model = copy_model(model).eval().requires_grad_(False)
        self.temperature = temperature

    def logps(self, step: int, micro: int, batch: TokenBatch) -> torch.Tensor:
        with torch.no_grad():
            return batch_logps(self.model, batch, self.temperature)


class AdapterOff(_Fixed):
    name = "an adapter-off"

    def __init__(self, model: torch.nn.Module, temperature: float = 1.0):
        self.model = model  # the (unwrapped) PeftModel
        self.temperature = temperature
        self.noisy = _noisy(model)

    def logps(self, step: int, micro: int, batch: TokenBatch) -> torch.Tensor:
        with _scoring(self.noisy), self.model.disable_adapter():
            return batch_logps(self.model, batch, self.temperature)


class Lookahead:
    def __init__(
        self, model: torch.nn.Module, batch_fn: BatchFn, accum: int, temperature: float = 1.0
    ):
        self.model, self.batch_fn, self.accum = model, batch_fn, accum
        self.temperature = temperature
        self.noisy = _noisy(model)
        self.cache: dict[tuple[int, int], torch.Tensor] = {}

    def refresh(self, step: int, until: int) -> None:
        """Make the current weights the reference of steps step+1 .. until (the trainer knows
        where the next sync point or the end of the data segment lies)."""
        self.cache.clear()  # any leftover belongs to the previous reference
        with _scoring(self.noisy):
            for s in range(step + 1, until + 1):
                for m in range(self.accum):
                    self.cache[(s, m)] = batch_logps(
                        self.model, self.batch_fn(s, m), self.temperature
                    )

    def logps(self, step: int, micro: int, batch: TokenBatch) -> torch.Tensor:
        try:
            return self.cache.pop((step, micro))
        except KeyError:
            raise RuntimeError(f"no reference log-probs for step {step} micro {micro}") from None

    def state_dict(self) -> dict:
        return {"cache": {f"{s}:{m}": t.cpu() for (s, m), t in self.cache.items()}}

    def load_state_dict(self, state: dict) -> None:
        device = next(self.model.parameters()).device
        self.cache = {
            tuple(int(x) for x in key.split(":")): t.to(device)  # type: ignore[misc]
            for key, t in state.get("cache", {}).items()
        }


def make_reference(
    policy: SyncPolicy,
    model: torch.nn.Module,
    unwrapped: torch.nn.Module,
    lora: bool,
    temperature: float = 1.0,
    copy_model: Callable[[torch.nn.Module], torch.nn.Module] = copy.deepcopy,
    **lookahead,
) -> Reference:
    """The one place the reference strategy is chosen (see the module docstring): a reference
    that moves (synced, or online: reset at every round's start) looks ahead."""
    if policy.moves:
        return Lookahead(model, temperature=temperature, **lookahead)
    if lora:
        return AdapterOff(unwrapped, temperature)
    return FrozenCopy(
        unwrapped, temperature, copy_model
    )  # FSDP: a sharded copy (trainer.distributed)
