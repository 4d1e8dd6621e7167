"""A job's cost estimate on this deployment (POST /v1/jobs/estimate, and kept with every job).

The decision is contract.estimate's; this module supplies what the API knows: the base model's
shape (api.caps.model_shape), the training file's size, and the device class and processes of
the job queue (JOB_DEVICE_KIND, JOB_PROCESSES) and the memory one of its processes has
(JOB_MEMORY_GIB; unset, the device's, or on a CPU queue this machine's: never the operator's
cap, which only bounds it), so the micro-batch it prints is the one the trainer will choose."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from api.caps import model_shape
from api.errors import api_error
from contract.estimate import JobEstimate, estimate_job, throughput_table
from contract.memory import GiB
from contract.spec import JobSpec
from models import job_events
from models.settings import Settings

CREATED_EVENT = "created"  # its data holds the spec and the estimate (models.jobs.create_job)


def memory_per_process(settings: Settings) -> int:
    """What one training process of the queue's worker class has: JOB_MEMORY_GIB, else the
    device class's memory, else (a CPU queue) this machine's ÷ JOB_PROCESSES; at most
    CAP_TRAIN_MEMORY_GIB."""
    device = throughput_table()["devices"][settings.JOB_DEVICE_KIND]
    if settings.JOB_MEMORY_GIB is not None:
        gib = settings.JOB_MEMORY_GIB
    elif device.get("memory_gib") is not None:
        gib = float(device["memory_gib"])
    else:
        gib = host_memory_bytes() / GiB / settings.JOB_PROCESSES
    return int(min(gib, settings.CAP_TRAIN_MEMORY_GIB) * GiB)


def host_memory_bytes() -> int:
    """This machine's memory, or its container's limit when lower (cgroup v2, then v1)."""
    import psutil

    total = int(psutil.virtual_memory().total)
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            limit = Path(path).read_text().strip()
        except OSError:
            continue
        if limit.isdigit():
            total = min(total, int(limit))
        break
    return total


def estimate_for(
    spec: JobSpec, settings: Settings, file_format: str | None, file_bytes: int, records: int
) -> JobEstimate | None:
    """The estimate of an admitted, resolved spec; None when the base model's shape is not
    readable here (its memory was not estimated either: admission warned)."""
    shape = model_shape(spec.base_model)
    if shape is None:
        return None
    try:
        return estimate_job(
            spec,
            shape,
            file_format=file_format,
            file_bytes=file_bytes,
            records=records,
            device=settings.JOB_DEVICE_KIND,
            processes=spec.parallelism.world_size(settings.JOB_PROCESSES),  # all nodes
            memory_bytes=memory_per_process(settings),
        )
    except ValueError as e:  # the batch does not split over the queue's processes
        raise api_error(422, str(e), field="batch_size") from e


def stored_estimate(session: Session, job_id: str) -> dict[str, Any] | None:
    """The estimate kept with a job at create time (in its `created` event), None if none."""
    data = job_events.event_data(session, job_id, CREATED_EVENT)
    estimate = (data or {}).get("estimate")
    return estimate if isinstance(estimate, dict) else None
