"""One training process's set-up: its Accelerator (bounded collectives, no buffer broadcast),
its seeds, and the result a run returns."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

from contract.runs import COLLECTIVE_TIMEOUT_ENV


@dataclass
class RunResult:
    status: str  # "succeeded" | "stopped"
    step: int
    total_steps: int
    final_dir: str | None

    def as_dict(self) -> dict:
        return self.__dict__.copy()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_accelerator(on_gpu: bool, mixed: str) -> Accelerator:
    """accelerate keeps one state per process and refuses another precision once it is set;
    a process that trains again in another precision (a test session, a benchmark) starts
    that state afresh. The distributed set-up (PartialState) is kept."""
    # No buffer broadcast on every DDP forward: the model's buffers (rotary frequencies) never
    # change, and the broadcast is a collective, so ranks whose steps run different numbers of
    # forwards (shared prompts, KTO's mismatched rows, lookahead scoring) would deadlock.
    # A bounded wait in every collective: a rank whose peer died (a lost node) fails with the
    # backend's timeout error instead of hanging (contract.runs.COLLECTIVE_TIMEOUT_ENV).
    timeout = timedelta(seconds=float(os.environ.get(COLLECTIVE_TIMEOUT_ENV, "1800")))
    handlers = [
        DistributedDataParallelKwargs(broadcast_buffers=False),
        InitProcessGroupKwargs(timeout=timeout),
    ]
    try:
        return Accelerator(cpu=not on_gpu, mixed_precision=mixed, kwargs_handlers=handlers)
    except ValueError:
        AcceleratorState._reset_state()
        return Accelerator(cpu=not on_gpu, mixed_precision=mixed, kwargs_handlers=handlers)
