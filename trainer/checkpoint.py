"""Checkpoints that resume bit-for-bit: trainable weights, optimizer, scheduler, RNG streams,
the reference's pending log-probs, the online round's examples (offline, the data position
follows from the step) and the spec.

Layout: `OUT/checkpoints/step-N/` holding `weights.safetensors` (adapter or full), `optimizer.pt`,
`scheduler.pt`, `rank-R.pt` (RNG + reference cache, one per process), `state.json` and
`spec.json`. A checkpoint is written under `step-N.tmp/` and renamed when every file is on
disk, so a directory named `step-N` is always complete (a crash leaves only a `.tmp`).

Weights and optimizer state come from the run's `Parallel` (trainer.distributed): under FSDP
the weights are gathered for rank 0 to write in this same file, and each rank writes its own
shard of the optimizer state as `optimizer-rank-R.pt` instead of `optimizer.pt`.

Every `.pt` file is read with `load_state` (torch.load's weights_only=True): tensors, plain
Python data and the few dataclasses of ours named in CHECKPOINT_TYPES (an online round's
examples), nothing else. A checkpoint crosses machines through the store; a pickle that could
run code on load is refused (UnsafeCheckpoint), never executed. The RNG states are saved as
that plain data (numpy's generator state as a list, not an ndarray).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy._core.multiarray import _reconstruct as np_reconstruct
from safetensors.torch import load_file, save_file

from contract.runs import (
    CHECKPOINT_SPEC_FILE,
    CHECKPOINT_STATE_FILE,
    CHECKPOINT_WEIGHTS_FILE,
    CHECKPOINTS_DIR,
    checkpoint_dir_name,
    checkpoint_step,
)
from trainer.online.rounds import Round
from trainer.recipes.grpo import GRPOGroup
from trainer.recipes.kto import Unpaired
from trainer.tokenize import TokenSeq

# The classes a checkpoint may hold besides tensors and plain data: an online round's
# examples (OnlineData.state_dict), and numpy arrays, which rank files written before numpy's
# RNG state was saved as a list hold (rebuilding an array runs no code; torch's documented
# allowlist for them). Anything else in a .pt file is refused.
CHECKPOINT_TYPES: list[Any] = [
    Round, TokenSeq, GRPOGroup, Unpaired, np.ndarray, np.dtype, np.dtypes.UInt32DType,
    np_reconstruct,
]  # fmt: skip


class UnsafeCheckpoint(ValueError):
    """A checkpoint file holds something other than tensors, plain data and CHECKPOINT_TYPES."""


def load_state(path: Path) -> Any:
    """torch.load(path) with weights_only=True and CHECKPOINT_TYPES allowed; raises
    UnsafeCheckpoint for a file that would need more (a pickle that runs code on load)."""
    try:
        with torch.serialization.safe_globals(CHECKPOINT_TYPES):
            return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's line naming what was refused ("... GLOBAL posix.system ..."), not its
        # advice to load the file with weights_only=False
        lines = str(exc).splitlines()
        reason = next((ln.strip() for ln in lines if "global" in ln.lower()), "not allowed")
        raise UnsafeCheckpoint(
            f"checkpoint file {path.name} holds more than tensors and plain data; "
            f"refusing to load it ({reason})"
        ) from None


@dataclass
class Checkpoint:
    step: int
    path: Path


def checkpoint_dir(out_dir: Path) -> Path:
    return Path(out_dir) / CHECKPOINTS_DIR


def latest(out_dir: Path) -> Checkpoint | None:
    """The newest complete checkpoint, if any."""
    found = []
    root = checkpoint_dir(out_dir)
    if root.is_dir():
        for p in root.iterdir():
            step = checkpoint_step(p.name)
            if step is not None and (p / CHECKPOINT_STATE_FILE).exists():
                found.append(Checkpoint(step, p))
    return max(found, key=lambda c: c.step, default=None)


def _rng_state() -> dict:
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": _numpy_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _numpy_state() -> tuple:
    """numpy's legacy generator state as plain data (its keys as a list, not an ndarray)."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    return name, np.asarray(keys).tolist(), pos, has_gauss, cached_gaussian


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached_gaussian))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(
    out_dir: Path,
    step: int,
    *,
    accelerator,
    parallel,
    model,
    optimizer,
    scheduler,
    reference,
    data,
    spec_json: str,
    extra: dict,
) -> Checkpoint:
    """Collective: every process calls it. Returns the final directory."""
    final = checkpoint_dir(out_dir) / checkpoint_dir_name(step)
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    rank = accelerator.process_index
    mine = {"rng": _rng_state(), "reference": reference.state_dict(), "data": data.state_dict()}
    torch.save(mine, tmp / f"rank-{rank}.pt")
    weights = parallel.trainable_state(model)  # collective; None except on rank 0
    parallel.save_optimizer(optimizer, tmp)  # optimizer.pt, or one shard per rank (FSDP)
    if accelerator.is_main_process:
        weights = {k: v.detach().cpu().contiguous() for k, v in weights.items()}
        save_file(weights, tmp / CHECKPOINT_WEIGHTS_FILE)
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        (tmp / CHECKPOINT_SPEC_FILE).write_text(spec_json)
        state = {
            "step": step,
            "world_size": accelerator.num_processes,
            "parallelism": parallel.name,
            **extra,
        }
        (tmp / CHECKPOINT_STATE_FILE).write_text(json.dumps(state, indent=2))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    accelerator.wait_for_everyone()
    return Checkpoint(step, final)


def load(
    ckpt: Checkpoint, *, accelerator, parallel, model, optimizer, scheduler, reference, data
) -> dict:
    """Restore everything `save` wrote; returns state.json."""
    state = json.loads((ckpt.path / CHECKPOINT_STATE_FILE).read_text())
    if state["world_size"] != accelerator.num_processes:
        raise ValueError(
            f"checkpoint {ckpt.path} was written by {state['world_size']} processes; "
            f"resume with the same number (got {accelerator.num_processes})"
        )
    if state.get("parallelism", "ddp") != parallel.name:  # their optimizer layouts differ
        raise ValueError(
            f"checkpoint {ckpt.path} was written with parallelism "
            f"{state.get('parallelism', 'ddp')!r}; resume with the same (got {parallel.name!r})"
        )
    parallel.load_trainable_state(model, load_file(ckpt.path / CHECKPOINT_WEIGHTS_FILE))
    parallel.load_optimizer(optimizer, ckpt.path)
    scheduler.load_state_dict(load_state(ckpt.path / "scheduler.pt"))
    mine = load_state(ckpt.path / f"rank-{accelerator.process_index}.pt")
    reference.load_state_dict(mine["reference"])
    data.load_state_dict(mine["data"])
    _set_rng_state(mine["rng"])
    return state
