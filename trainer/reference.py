"""Where reference log-probs come from. The choice is made once, in `make_reference`.

- An objective without a reference (SFT, `JobSpec.needs_reference`): none at all, no copy,
  no forward.

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
from trainer.logps import batch_logps, token_logps
from trainer.tokenize import TokenBatch, TokenSeq

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


class NoReference(_Fixed):
    """For a loss that compares with no reference (SFT): nothing is copied or scored."""

    name = "no"

    def logps(self, step: int, micro: int, batch: TokenBatch) -> torch.Tensor:
        return torch.zeros(0)  # never read: the loss takes only the policy's log-probs


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
    """The reference of the next steps, scored ahead (see the module docstring).

    Log-probs are kept per row (its TokenSeq), not per micro-batch: any split of a step's batch
    reads them back, so the micro-batch may change between the refresh and the step (halved
    after an out-of-memory error, or chosen anew by a resumed attempt). The steps ahead are
    scored in groups of up to `max_rows()` rows (several micro-batches per forward: fewer,
    larger no-grad forwards); the number of groups depends only on row counts, which are equal
    on every rank, so the forwards stay collective under FSDP.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        batch_fn: BatchFn,
        micro_count: Callable[[], int],
        collate_fn: Callable[[list[TokenSeq]], TokenBatch],
        max_rows: Callable[[], int],
        temperature: float = 1.0,
    ):
        self.model, self.batch_fn, self.micro_count = model, batch_fn, micro_count
        self.collate_fn, self.max_rows = collate_fn, max_rows
        self.temperature = temperature
        self.noisy = _noisy(model)
        self.cache: dict[int, dict[TokenSeq, torch.Tensor]] = {}  # step -> row -> log-probs

    def refresh(self, step: int, until: int) -> None:
        """Make the current weights the reference of steps step+1 .. until (the trainer knows
        where the next sync point or the end of the data segment lies).

        The new cache replaces the old one only once it is complete, and keeps the steps up to
        `step`: a step redone after an out-of-memory error still finds its reference."""
        ahead = [
            (s, row)
            for s in range(step + 1, until + 1)
            for m in range(self.micro_count())
            for row in self.batch_fn(s, m).all_rows()
        ]
        cache: dict[int, dict[TokenSeq, torch.Tensor]] = {
            s: rows for s, rows in self.cache.items() if s <= step
        }
        size = max(1, self.max_rows())
        with _scoring(self.noisy):
            for i in range(0, len(ahead), size):
                group = ahead[i : i + size]
                batch = self.collate_fn([row for _, row in group])
                lp = token_logps(self.model, batch, self.temperature)
                for (s, row), values in zip(group, _split_rows(lp, batch), strict=True):
                    cache.setdefault(s, {})[row] = values
        self.cache = cache

    def install(
        self, step: int, rows: dict[int, list[TokenSeq]], logps: dict[TokenSeq, torch.Tensor]
    ) -> None:
        """Make given log-probs (`logps` by row) the reference of the steps in `rows` (step ->
        its rows) from `step` on: an async online round's reference, scored by the policy
        version that sampled it (trainer.online.producer)."""
        device = next(self.model.parameters()).device
        cache = {s: kept for s, kept in self.cache.items() if s < step}
        for s, step_rows in rows.items():
            cache[s] = {row: logps[row].to(device) for row in step_rows}
        self.cache = cache

    def logps(self, step: int, micro: int, batch: TokenBatch) -> torch.Tensor:
        """[N + M, W] reference log-probs of `batch`'s rows and aux rows (batch_logps' layout)."""
        for old in [s for s in self.cache if s < step]:
            del self.cache[old]  # steps that have run
        try:
            return in_layout(self.cache.get(step, {}), batch)
        except KeyError:
            raise RuntimeError(f"no reference log-probs for step {step} micro {micro}") from None

    def state_dict(self) -> dict:
        return {
            "rows": [
                {
                    "step": s,
                    "prompt": torch.tensor(row.prompt_ids, dtype=torch.long),
                    "completion": torch.tensor(row.completion_ids, dtype=torch.long),
                    "logps": values.cpu(),
                }
                for s, rows in self.cache.items()
                for row, values in rows.items()
            ]
        }

    def load_state_dict(self, state: dict) -> None:
        device = next(self.model.parameters()).device
        self.cache = {}
        for item in state.get("rows", []):
            row = TokenSeq(tuple(item["prompt"].tolist()), tuple(item["completion"].tolist()))
            self.cache.setdefault(int(item["step"]), {})[row] = item["logps"].to(device)
        # Checkpoints written before rows were keyed: one [N + M, W] tensor per (step, micro),
        # read back through the plan's micro-batches (the trainer restores that run's split).
        for key, lp in state.get("cache", {}).items():
            s, m = (int(x) for x in key.split(":"))
            batch = self.batch_fn(s, m)
            split = _split_rows(lp, batch)
            for row, values in zip(batch.all_rows(), split, strict=True):
                self.cache.setdefault(s, {})[row] = values.to(device)


def in_layout(rows: dict[TokenSeq, torch.Tensor], batch: TokenBatch) -> torch.Tensor:
    """[N + M, W] per-row log-probs (`rows`: row -> its completion tokens' values) in
    `batch`'s layout (batch_logps'); KeyError for a row `rows` lacks."""
    values = [rows[row] for row in batch.all_rows()]
    shape = (len(batch.all_rows()), batch.row_width)
    out = torch.zeros(shape, dtype=values[0].dtype, device=values[0].device)
    # integer positions (TokenBatch.row_kept), not out[mask > 0]: a boolean index makes
    # the host wait for the device to count the mask
    kept = batch.row_kept().to(out.device)
    return out.view(-1).index_copy_(0, kept, torch.cat(values).to(out.device)).view(shape)


def _split_rows(lp: torch.Tensor, batch: TokenBatch) -> list[torch.Tensor]:
    """Each row's completion-token log-probs, in order, from `lp` in `batch.row_mask()`'s
    layout (a row's mask marks exactly its completion tokens, in any batch layout). `batch`
    is the host batch: the rows' counts come from its mask, the positions from `row_kept`,
    so the device is never asked (a boolean index per row would make the host wait)."""
    counts = batch.row_mask().sum(dim=1).long().tolist()
    flat = lp.reshape(-1).index_select(0, batch.row_kept().to(lp.device))
    return list(flat.split(counts))


def make_reference(
    needed: bool,
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
    if not needed:
        return NoReference()
    if policy.moves:
        return Lookahead(model, temperature=temperature, **lookahead)
    if lora:
        return AdapterOff(unwrapped, temperature)
    return FrozenCopy(
        unwrapped, temperature, copy_model
    )  # FSDP: a sharded copy (trainer.distributed)
