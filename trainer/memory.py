"""How much memory a training process may use, and what happens when a step runs out of it.

`available_bytes` is the memory the estimate (contract.memory) is compared with when the trainer
chooses its micro-batch (contract.micro_batch.choose_micro_batch): on a GPU the device's free memory
plus what this process already holds; on a CPU the smallest of the host's available memory,
the cgroup's limit (a container's, the worker's) and `HUMANLINE_TRAIN_MEMORY_GIB`, shared by the
node's training processes. Every rank takes the least of all ranks' figures, so all choose the
same micro-batch.

An out-of-memory error inside a step (`torch.OutOfMemoryError`) is answered by `next_accum`:
the next split of the process's share of the batch (half the micro-batch when it is even). One
process redoes the step in place; several stop with `OutOfMemoryRetry`, and the next attempt
resumes from the last checkpoint with the split the trainer wrote to `MICRO_BATCH_FILE`.
"""

from __future__ import annotations

import gc
import json
import os
from dataclasses import replace
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from contract.memory import ModelShape
from contract.micro_batch import MicroBatchChoice, choose_micro_batch
from contract.runs import MICRO_BATCH_FILE, OUT_OF_MEMORY_EVENT
from contract.spec import JobSpec

GiB = 1 << 30
MEMORY_LIMIT_ENV = "HUMANLINE_TRAIN_MEMORY_GIB"  # per training process; the worker or a test
CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
    (
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",  # cgroup v1
        "/sys/fs/cgroup/memory/memory.usage_in_bytes",
    ),
)


class OutOfMemoryRetry(RuntimeError):
    """Several processes ran out of memory: retry from the last checkpoint with a smaller
    micro-batch (written to MICRO_BATCH_FILE); the trainer exits with EXIT_OUT_OF_MEMORY."""


def available_bytes(device: torch.device, local_processes: int = 1) -> int:
    """The memory one training process on `device` may use in all (see the module docstring)."""
    override = os.environ.get(MEMORY_LIMIT_ENV)
    if override:
        return int(float(override) * GiB)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device))
    own = psutil.Process().memory_info().rss
    host = psutil.virtual_memory().available + own * local_processes
    limit = _cgroup_room()
    room = host if limit is None else min(host, limit + own * local_processes)
    return int(room // max(1, local_processes))


def _cgroup_room() -> int | None:
    """The cgroup's limit less its current use, if a limit is set."""
    for limit_file, usage_file in CGROUP_FILES:
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:  # v2 "max", v1's "unlimited" page count
            return None
        return max(0, int(limit) - usage)
    return None


def least_across_ranks(value: int, device: torch.device) -> int:
    """The smallest `value` of all ranks (every rank must call it), or `value` alone."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def next_accum(per_process: int, accum: int) -> int | None:
    """The next split of a process's `per_process` examples after `accum` micro-batches: the
    fewest micro-batches whose size is at most half of today's (so half the micro-batch when it
    is even), or None when a micro-batch is already one example."""
    size = per_process // accum
    if size <= 1:
        return None
    return next(
        a
        for a in range(accum + 1, per_process + 1)
        if per_process % a == 0 and per_process // a <= size // 2
    )


def read_micro_batch_file(out_dir: Path) -> int | None:
    """The grad_accum a previous attempt asked for after running out of memory, if any."""
    try:
        return int(json.loads((Path(out_dir) / MICRO_BATCH_FILE).read_text())["grad_accum"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_micro_batch_file(out_dir: Path, *, grad_accum: int, micro_batch: int, step: int) -> None:
    """Atomically (temp file, then rename): a crash never leaves half a file."""
    path = Path(out_dir) / MICRO_BATCH_FILE
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"grad_accum": grad_accum, "micro_batch": micro_batch, "step": step}))
    os.replace(tmp, path)


def choose_micro_batch_here(
    spec: JobSpec, accelerator, model_dir: Path, out_dir: Path, resume: bool
) -> tuple[MicroBatchChoice, int]:
    """(the split of this process's share of the batch that fits its memory, the memory in
    bytes): the same on every rank (the least memory of all ranks); at least the split an
    earlier attempt's out-of-memory error asked for (MICRO_BATCH_FILE) when the spec leaves
    grad_accum unset."""
    world, device = accelerator.num_processes, accelerator.device
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # processes on this node
    room = least_across_ranks(available_bytes(device, local), device)
    shape = ModelShape.from_model_dir(model_dir)
    choice = choose_micro_batch(spec, shape, room, world=world, device=device.type)
    asked = read_micro_batch_file(out_dir) if resume else None
    per_process = spec.examples_per_batch // world
    if spec.grad_accum is None and asked and asked > choice.grad_accum and per_process % asked == 0:
        pinned = spec.model_copy(update={"grad_accum": asked})
        choice = choose_micro_batch(pinned, shape, room, world=world, device=device.type)
    return choice, room


def forget_gradients(model: torch.nn.Module, optimizer) -> None:
    """Drop every gradient a failed attempt at a step left, so its redo starts from none.

    optimizer.zero_grad clears the parameters' `.grad`, which under FSDP2 are the sharded ones
    only: micro-batches run without gradient sync accumulate into each FSDPParam's unsharded
    buffers (`unsharded_param.grad`, or `unsharded_accumulated_grad` when reduce_dtype differs),
    which the next synced backward would reduce-scatter into the redone step. The root's
    `reset_iter_state` (torch >= 2.13) first reshards and clears the iteration state that an
    error in the middle of a forward or backward leaves (it keeps those buffers)."""
    optimizer.zero_grad(set_to_none=True)
    reset = getattr(model, "reset_iter_state", None)
    if reset is not None:
        reset()
    for module in model.modules():
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
        for group in getattr(state, "_fsdp_param_groups", ()):
            for param in group.fsdp_params:
                param.unsharded_accumulated_grad = None
                unsharded = getattr(param, "_unsharded_param", None)
                if unsharded is not None:
                    unsharded.grad = None


def after_out_of_memory(
    spec: JobSpec,
    accelerator,
    choice: MicroBatchChoice,
    step: int,
    error: BaseException,
    log,
    out_dir: Path,
) -> MicroBatchChoice:
    """The finer split after an out-of-memory error in `step`, once what the attempt held is
    freed; recorded as an `out_of_memory` event. Several processes: written to MICRO_BATCH_FILE
    and raised as OutOfMemoryRetry (a rank cannot leave a collective alone). RuntimeError when
    the user set grad_accum or a micro-batch is already one example."""
    gc.collect()
    if accelerator.device.type == "cuda":
        torch.cuda.empty_cache()
    world = accelerator.num_processes
    per_process = spec.examples_per_batch // world
    accum = choice.grad_accum
    new = next_accum(per_process, accum) if spec.grad_accum is None else None
    if new is None:
        why = (
            f"grad_accum is set to {spec.grad_accum}: raise it, or leave it unset so the "
            "trainer chooses"
            if spec.grad_accum is not None
            else "a micro-batch is already one example: lower max_length, use a LoRA adapter "
            "or a smaller base_model, or set activation_checkpointing on"
        )
        raise RuntimeError(f"out of memory at step {step} ({error}); {why}") from error
    micro = per_process // new
    then = "redoing the step" if world == 1 else "retrying from the last checkpoint"
    message = (
        f"out of memory at step {step} with {per_process // accum} examples per micro-batch; "
        f"{then} with {micro} (grad_accum {new})"
    )
    log.event(OUT_OF_MEMORY_EVENT, message, step=step, grad_accum=new, micro_batch=micro)
    if world > 1:
        write_micro_batch_file(out_dir, grad_accum=new, micro_batch=micro, step=step)
        raise OutOfMemoryRetry(message) from error
    # the head recomputes from now on: memory is what this step lacked
    return replace(choice, grad_accum=new, micro_examples=micro, keep_softmax=False)
