"""argv of one trainer attempt: the single place the worker decides how ranks are started.

* one process: `python -m trainer run SPEC --out RUN --no-progress [--resume]`;
* several GPUs: `accelerate launch --multi_gpu --num_processes N` (torchrun underneath; the
  devices are CUDA_VISIBLE_DEVICES, see worker.routing.trainer_env);
* several CPU processes: `torch.distributed.run` (torchrun) directly, because
  `accelerate launch --cpu` starts ONE process unless MPI is installed (its simple launcher),
  so a 2-process CPU job silently trained alone. The trainer's Accelerator reads torchrun's
  RANK/WORLD_SIZE and joins a gloo group.

DDP or FSDP is not a launch matter: both start the same ranks, and the trainer applies the
spec's `parallelism` (trainer.distributed). Each job gets its own rendezvous port, so two
multi-process jobs on one machine do not collide on the default 29500.
"""

from __future__ import annotations

import socket
from pathlib import Path

from worker.routing import Placement


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer_command(
    python: str,
    spec_path: Path,
    run_dir: Path,
    *,
    resume: bool,
    place: Placement,
    main_process_port: int | None = None,
) -> list[str]:
    """argv of one attempt (module docstring)."""
    run = ["-m", "trainer", "run", str(spec_path), "--out", str(run_dir), "--no-progress"]
    if resume:
        run.append("--resume")
    if place.num_processes == 1:
        return [python, *run]
    port = str(main_process_port or free_port())
    if place.gpu_ids:
        launch = [
            python, "-m", "accelerate.commands.launch",
            "--num_processes", str(place.num_processes),
            "--num_machines", "1",
            "--main_process_port", port,
            "--mixed_precision", "no",  # the spec's precision is applied by the trainer itself
            "--dynamo_backend", "no",
            "--multi_gpu",  # devices: CUDA_VISIBLE_DEVICES (trainer_env)
        ]  # fmt: skip
        return [*launch, *run]
    launch = [
        python, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", str(place.num_processes),
        "--master-addr", "127.0.0.1", "--master-port", port,
    ]  # fmt: skip
    return [*launch, *run]  # torchrun's own -m: run `trainer` as a module in every rank
