"""Where a job runs: its queue, and the placement of an attempt (process count, devices, the
trainer's environment). The argv that starts the trainer on a placement is worker.launch's.

Routing rule (one place, documented in README terms):
  * job metadata `gpus` (a string, as all metadata) set to an integer N: N >= 1 → `gpu`,
    N = 0 → `cpu`;
  * otherwise the base model decides: models named in WORKER_CPU_MODELS (default
    "tiny-llama") → `cpu`, every other model → `gpu`.

Process count of an attempt (`placement`):
  1. resuming: the checkpoint's world size (state.json), because optimizer and RNG state are
     per process and the trainer refuses another count;
  2. else metadata `gpus` = N (N >= 1);
  3. else every GPU of the worker (WORKER_GPUS), or 1 process on a CPU worker.
N > 1 runs N ranks (worker.launch: accelerate launch on GPUs, torchrun on CPUs). Devices:
WORKER_GPUS=ids:0,1,2,3 (or all, count:N; worker.gpus) gives the trainer CUDA_VISIBLE_DEVICES
= the first N of them, one distinct device per rank; WORKER_GPUS=none sets it to "" (a CPU
worker on a GPU machine never grabs a GPU); unset, the trainer inherits the worker's devices
and runs one process (the embedded server, a one-GPU box). worker.gpus.place_attempt checks
the placement against the devices the trainer will see before it starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.tasks import CPU_QUEUE, GPU_QUEUE, WORKER_QUEUES  # noqa: F401 (re-exported)

PROJECT_ROOT = Path(__file__).resolve().parents[1]


class PlacementError(ValueError):
    """The job cannot run on this worker (asks more GPUs than it has, bad metadata)."""


def requested_gpus(metadata: dict[str, Any] | None) -> int | None:
    """metadata["gpus"] as an int, None when absent; PlacementError when malformed."""
    raw = (metadata or {}).get("gpus")
    if raw is None or raw == "":
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise PlacementError(f"metadata gpus must be a non-negative integer, got {raw!r}") from None
    if value < 0:
        raise PlacementError(f"metadata gpus must be a non-negative integer, got {raw!r}")
    return value


def queue_for(base_model: str, metadata: dict[str, Any] | None, cpu_models: frozenset[str]) -> str:
    """The queue a job belongs on (see the module docstring)."""
    try:
        gpus = requested_gpus(metadata)
    except PlacementError:
        gpus = None  # the runner fails the job with the message; route it by model meanwhile
    if gpus is not None:
        return GPU_QUEUE if gpus > 0 else CPU_QUEUE
    return CPU_QUEUE if base_model in cpu_models else GPU_QUEUE


@dataclass(frozen=True)
class Placement:
    num_processes: int
    gpu_ids: tuple[str, ...] = ()  # the GPUs to use; empty: see `cpu`
    cpu: bool = False  # True: hide every GPU; False with no gpu_ids: inherit the environment

    @property
    def cuda_visible_devices(self) -> str | None:
        """CUDA_VISIBLE_DEVICES for the trainer; None leaves the worker's own."""
        if self.gpu_ids:
            return ",".join(self.gpu_ids)
        return "" if self.cpu else None


def placement(
    metadata: dict[str, Any] | None,
    worker_gpus: list[str] | None,
    resume_world_size: int | None = None,
) -> Placement:
    """How many processes an attempt uses and on which devices (module docstring).

    `worker_gpus` (WorkerSettings.gpu_ids): the worker's GPU ids; [] for a CPU-only worker
    (WORKER_GPUS=none); None when unset, meaning one process that sees whatever devices
    the worker sees (the embedded server, a single-GPU box).
    """
    asked = requested_gpus(metadata)
    if resume_world_size is not None:
        n, why = resume_world_size, "its checkpoint was written by"
    elif asked:
        n, why = asked, "it asks for"
    else:
        n, why = max(1, len(worker_gpus or ())), ""
    if worker_gpus is None:
        if n > 1:
            raise PlacementError(
                f"the job needs {n} processes ({why} {n}); set WORKER_GPUS (all, count:N or "
                "ids:...) to the GPUs this worker may use"
            )
        return Placement(1)
    if worker_gpus:
        if n > len(worker_gpus):
            raise PlacementError(
                f"the job needs {n} GPUs ({why} {n} processes); this worker has "
                f"{len(worker_gpus)} (GPU ids {','.join(worker_gpus)})"
            )
        return Placement(n, tuple(worker_gpus[:n]))
    if asked and resume_world_size is None:
        raise PlacementError(f"the job asks for {asked} GPUs; this worker has none")
    return Placement(n, cpu=True)


def trainer_env(place: Placement, base: dict[str, str] | None = None) -> dict[str, str]:
    """The trainer's environment: ours, plus the project on PYTHONPATH (the worker may run
    from another directory without the package installed) and its devices."""
    env = dict(os.environ if base is None else base)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(PROJECT_ROOT) + (os.pathsep + path if path else "")
    if place.cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = place.cuda_visible_devices
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env
