"""The GPUs a worker owns (WORKER_GPUS), and the check that a job placed on GPUs sees them.

WORKER_GPUS, one meaning per value (anything else is refused when the worker starts):

    (unset) / ""   one process with the worker's own devices (the embedded server, a dev box)
    none | cpu     CPU only: the trainer sees no GPU (CUDA_VISIBLE_DEVICES="")
    all            every CUDA device the worker sees (counted by torch in a child process)
    count:N        N GPUs: the first N of the worker's CUDA_VISIBLE_DEVICES, else ids 0..N-1
    ids:A,B,...    exactly these devices (indexes, or GPU-/MIG- UUIDs)

A bare number ("8") or list ("0,1") is refused: an earlier version read "8" as the GPU with
id 8 while the Kubernetes manifest meant eight GPUs, and the job trained on CPU.

Before the trainer starts, `place_attempt` decides the placement (worker.routing.placement)
and checks it against the CUDA devices the trainer will actually see (`cuda_device_count`:
torch in a child process with the trainer's environment; the worker never imports torch):

  * a worker that declares GPUs (all, count:N, ids:...) or a job that asks for them
    (metadata `gpus`) needs one device per process;
  * a Celery worker running a job of the `gpu` queue needs at least one, and a CPU-only one
    (WORKER_GPUS=none) refuses it;
  * the embedded worker (BROKER_URL=memory://) runs `gpu`-queue jobs on whatever it has (the
    CPU demo) unless WORKER_GPUS declares GPUs.

Every failure is a PlacementError: the job fails with a `placement_error` event saying what is
missing, never silently trains on CPU.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Any, Literal

from worker.routing import (
    GPU_QUEUE,
    Placement,
    PlacementError,
    placement,
    queue_for,
    requested_gpus,
    trainer_env,
)

Kind = Literal["inherit", "none", "all", "count", "ids"]
_ID = re.compile(r"^[A-Za-z0-9_.:/-]+$")
PROBE = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
PROBE_TIMEOUT_S = 300.0  # a cold torch import on a busy node


@dataclass(frozen=True)
class WorkerGpus:
    kind: Kind
    count: int = 0  # count:N
    ids: tuple[str, ...] = ()  # ids:...

    @property
    def declares_gpus(self) -> bool:
        return self.kind in ("all", "count", "ids")


def parse_worker_gpus(value: str | None) -> WorkerGpus:
    """WORKER_GPUS → what it means; ValueError with the accepted forms otherwise."""
    raw = (value or "").strip()
    low = raw.lower()
    if not raw:
        return WorkerGpus("inherit")
    if low in ("none", "cpu"):
        return WorkerGpus("none")
    if low == "all":
        return WorkerGpus("all")
    if low.startswith("count:"):
        n = low[len("count:") :].strip()
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"WORKER_GPUS={raw!r}: count:N needs a whole number N >= 1")
        return WorkerGpus("count", count=int(n))
    if low.startswith("ids:"):
        ids = tuple(i.strip() for i in raw[len("ids:") :].split(","))
        if not ids or any(not i or not _ID.match(i) for i in ids):
            raise ValueError(f"WORKER_GPUS={raw!r}: ids: needs device ids separated by commas")
        if len(set(ids)) != len(ids):
            raise ValueError(f"WORKER_GPUS={raw!r}: a device id is listed twice")
        return WorkerGpus("ids", ids=ids)
    parts = [p.strip() for p in raw.split(",")]
    if all(p.isdigit() for p in parts):
        hint = (
            f"write count:{parts[0]} for {parts[0]} GPUs or ids:{parts[0]} for the GPU with "
            f"id {parts[0]}"
            if len(parts) == 1
            else f"write ids:{','.join(parts)} for these GPU ids"
        )
        raise ValueError(f"WORKER_GPUS={raw!r} is ambiguous: {hint}")
    raise ValueError(
        f"WORKER_GPUS={raw!r} is not understood: use none, all, count:N or ids:A,B (or leave "
        "it unset for the worker's own devices)"
    )


# --- what torch sees --------------------------------------------------------------------------

_probed: dict[tuple[str, str | None, str | None], tuple[int, str]] = {}


def cuda_device_count(python: str, env: dict[str, str]) -> tuple[int, str]:
    """(CUDA devices torch sees under `env`, why none when 0), once per interpreter and
    device mask per worker process."""
    key = (python, env.get("CUDA_VISIBLE_DEVICES"), env.get("NVIDIA_VISIBLE_DEVICES"))
    if key not in _probed:
        try:
            out = subprocess.run(
                [python, "-c", PROBE],
                check=False,
                env=env,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            _probed[key] = (0, f"the CUDA probe could not run: {exc}")
        else:
            lines = out.stdout.strip().splitlines()
            if out.returncode == 0 and lines and lines[-1].strip().isdigit():
                n = int(lines[-1])
                _probed[key] = (n, "" if n else "torch.cuda.is_available() is False")
            else:
                tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
                _probed[key] = (0, f"the CUDA probe failed: {tail[:300]}")
    return _probed[key]


def clear_probe_cache() -> None:
    _probed.clear()


def _visible_env(environ: dict[str, str]) -> list[str] | None:
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def worker_gpu_ids(
    gpus: WorkerGpus, python: str, environ: dict[str, str] | None = None
) -> list[str] | None:
    """The worker's GPU ids (CUDA_VISIBLE_DEVICES values for its trainers): None = inherit
    (unset), [] = CPU only. PlacementError when `all`/`count:N` cannot be met."""
    environ = dict(os.environ if environ is None else environ)
    if gpus.kind == "inherit":
        return None
    if gpus.kind == "none":
        return []
    if gpus.kind == "ids":
        return list(gpus.ids)
    visible = _visible_env(environ)
    if gpus.kind == "count":
        if visible is None:
            return [str(i) for i in range(gpus.count)]
        if len(visible) < gpus.count:
            raise PlacementError(
                f"WORKER_GPUS=count:{gpus.count} but the worker's CUDA_VISIBLE_DEVICES lists "
                f"{len(visible)} device(s) ({','.join(visible) or 'none'})"
            )
        return visible[: gpus.count]
    n, why = cuda_device_count(python, environ)  # all
    if n == 0:
        raise PlacementError(f"WORKER_GPUS=all but this worker sees no CUDA device ({why})")
    return visible[:n] if visible is not None else [str(i) for i in range(n)]


# --- the check before an attempt ------------------------------------------------------------


def place_attempt(
    settings: Any, spec: dict[str, Any], meta: dict[str, Any], world: int | None
) -> Placement:
    """The placement of one attempt, checked against the devices its trainer will see.

    `settings`: worker.config.WorkerSettings (WORKER_GPUS, TRAINER_PYTHON, WORKER_CPU_MODELS,
    embedded_worker)."""
    gpus = parse_worker_gpus(settings.WORKER_GPUS)
    python = settings.TRAINER_PYTHON
    place = placement(meta, worker_gpu_ids(gpus, python), world)
    on_gpu_queue = (
        queue_for(str(spec.get("base_model", "")), meta, settings.cpu_models) == GPU_QUEUE
    )
    celery = not settings.embedded_worker
    if place.cpu:
        if on_gpu_queue and celery:
            raise PlacementError(
                "the job is on the gpu queue but this worker is CPU-only (WORKER_GPUS="
                f"{settings.WORKER_GPUS.strip()}); let only GPU workers consume the gpu queue"
            )
        return place
    try:
        asked = requested_gpus(meta)
    except PlacementError:
        asked = None  # placement() has already refused a malformed value
    if place.gpu_ids or asked or (on_gpu_queue and celery):
        need = place.num_processes
        n, why = cuda_device_count(python, trainer_env(place))
        if n < need:
            where = (
                f"CUDA_VISIBLE_DEVICES={place.cuda_visible_devices}"
                if place.cuda_visible_devices is not None
                else "the worker's own devices"
            )
            raise PlacementError(
                f"the job needs {need} CUDA device(s) (gpu queue, WORKER_GPUS="
                f"{settings.WORKER_GPUS.strip() or 'unset'}) but its trainer sees {n} with "
                f"{where}" + (f": {why}" if why else "") + "; it would train on CPU"
            )
    return place
