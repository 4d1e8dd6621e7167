"""Out of memory across attempts (issue 25, DESIGN.md §5 "Memory is the trainer's job").

The trainer picks its micro-batch itself. One process halves it in place when a step runs
out of memory; several processes cannot (the other ranks wait in a collective), so rank 0
writes RUN_DIR/micro_batch.json ({"grad_accum", "micro_batch", "step"}) and the attempt
ends. The worker then gives the job back to the queue, and the next attempt (any worker, a
fresh directory) starts with that file in its run directory.

Where the halved micro-batch lives between attempts: the job's newest `out_of_memory`
event in the DB (the trainer's, copied by worker.progress, or the worker's own when the
trainer's is missing), written in the same fenced transaction that requeues the job, so
the record and the requeue land together or not at all. Not the object store: a new key
there would be one more thing for the sweeper to judge, and the DB already has it. The
newest in-place halving of a one-process run is found the same way, so an attempt after
a worker shutdown does not run out of memory again to learn it.

How the worker tells an out-of-memory end from a crash: a micro_batch.json unlike the one
it wrote at start. Not the exit code alone: `accelerate launch` / torchrun exit 1 when a
rank fails, whatever the rank's own code (torch.distributed.elastic's ChildFailedError),
so EXIT_OUT_OF_MEMORY reaches the worker only from a lone trainer.

Cost: one query per attempt (the newest `out_of_memory` event, on the job's (job_id, seq)
index) and one small file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from contract.runs import MICRO_BATCH_FILE, OUT_OF_MEMORY_EVENT
from models.tables import JobEvent

FIELDS = ("grad_accum", "micro_batch", "step")


def record_of(data: Any) -> dict[str, int] | None:
    """The {"grad_accum", "micro_batch"[, "step"]} of a micro_batch.json or an
    out_of_memory event's data; None when it does not hold positive ints for both."""
    if not isinstance(data, dict):
        return None
    record = {k: data[k] for k in FIELDS if isinstance(data.get(k), int)}
    if record.get("grad_accum", 0) < 1 or record.get("micro_batch", 0) < 1:
        return None
    return record


def last_record(s: Session, job_id: str) -> dict[str, int] | None:
    """The micro-batch of the job's newest out_of_memory event (None: it never ran out)."""
    data = s.execute(
        select(JobEvent.data)
        .where(JobEvent.job_id == job_id, JobEvent.kind == OUT_OF_MEMORY_EVENT)
        .order_by(JobEvent.seq.desc())
        .limit(1)
    ).scalar()
    return record_of(data)


def write(run_dir: Path, record: dict[str, int]) -> None:
    (run_dir / MICRO_BATCH_FILE).write_text(json.dumps(record))


def ran_out(run_dir: Path, given: dict[str, int] | None) -> dict[str, int] | None:
    """The trainer's new micro_batch.json (it ran out of memory), or None: no file, an
    unreadable one, or the one the worker wrote at start."""
    try:
        found = record_of(json.loads((run_dir / MICRO_BATCH_FILE).read_text()))
    except (OSError, ValueError):
        return None
    return None if found == given else found


def describe(record: dict[str, int]) -> str:
    return f"micro-batches of {record['micro_batch']} (grad_accum {record['grad_accum']})"


def requeue_reason(record: dict[str, int], attempt: int, max_attempts: int) -> str:
    at = f" at step {record['step']}" if "step" in record else ""
    return (
        f"out of GPU memory{at} (attempt {attempt} of {max_attempts}); requeued to resume "
        f"from the last checkpoint with {describe(record)}"
    )


def exhausted_error(
    record: dict[str, int], attempts: int, started: dict[str, Any] | None
) -> dict[str, Any]:
    """The error of a job that ran out of memory on its last allowed attempt: what it ran
    with, the memory the trainer counted on, and what a team can change."""
    started = started or {}
    estimate, available = started.get("memory_estimate_gib"), started.get("memory_available_gib")
    memory = ""
    if isinstance(estimate, int | float) and isinstance(available, int | float):
        memory = f" (estimated {estimate:.1f} GiB of {available:.1f} GiB available per GPU)"
    message = (
        f"out of GPU memory on attempt {attempts}, the last one allowed (MAX_JOB_ATTEMPTS)"
        f"{memory}; the next try would have used {describe(record)}. Lower max_length "
        "(or max_prompt_length) or batch_size, set activation_checkpointing to on, set "
        "grad_accum higher, or run on more GPUs or GPUs with more memory."
    )
    return {"type": OUT_OF_MEMORY_EVENT, "message": message, "attempts": attempts, **record}
