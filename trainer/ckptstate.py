"""What a checkpoint's plain files hold and how they are read safely: the types allowed in a
`.pt` file (CHECKPOINT_TYPES), `load_state` (torch.load with weights_only=True), the RNG
streams saved and restored, and the `Checkpoint` handle. A leaf of trainer.checkpoint (both
formats' loaders use it)."""

from __future__ import annotations

import pickle
import random
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from numpy._core.multiarray import _reconstruct as np_reconstruct

from trainer.ckptio import Root, UnsafeCheckpoint
from trainer.online.rounds import Round
from trainer.recipes.grpo import GRPOGroup
from trainer.recipes.kto import Unpaired
from trainer.tokenize import TokenSeq

__all__ = ["CHECKPOINT_TYPES", "Checkpoint", "UnsafeCheckpoint", "load_state"]

# The classes a checkpoint may hold besides tensors and plain data: an online round's
# examples (OnlineData.state_dict), and numpy arrays, which rank files written before numpy's
# RNG state was saved as a list hold (rebuilding an array runs no code; torch's documented
# allowlist for them). Anything else in a .pt file is refused.
CHECKPOINT_TYPES: list[Any] = [
    Round, TokenSeq, GRPOGroup, Unpaired, np.ndarray, np.dtype, np.dtypes.UInt32DType,
    np_reconstruct,
]  # fmt: skip


def load_state(path: Root, source: IO[bytes] | None = None) -> Any:
    """torch.load(path) (or of `source`, the bytes read from `path`) with weights_only=True and
    CHECKPOINT_TYPES allowed; raises UnsafeCheckpoint for a file that would need more (a pickle
    that runs code on load)."""
    try:
        with torch.serialization.safe_globals(CHECKPOINT_TYPES):
            return torch.load(source or path, weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's line naming what was refused ("... GLOBAL posix.system ..."), not its
        # advice to load the file with weights_only=False
        lines = str(exc).splitlines()
        reason = next((ln.strip() for ln in lines if "global" in ln.lower()), "not allowed")
        raise UnsafeCheckpoint(
            f"checkpoint file {Path(str(path)).name} holds more than tensors and plain data; "
            f"refusing to load it ({reason})"
        ) from None


@dataclass
class Checkpoint:
    step: int
    path: Root


def rng_state() -> dict:
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


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached_gaussian))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
