"""A job's events: a gap-free `seq` per job, taken with the UPDATE of the job row itself.

Kinds used: status, created, log, warning, error, checkpoint, metrics, data_quality, ... (see
models.jobs for the `status` events of transitions and contract.runs for the trainer's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, func, select, update
from sqlalchemy.orm import Session

from contract.runs import OUT_OF_MEMORY_EVENT
from models.tables import Job, JobEvent


def _bump_seq(
    session: Session, job_id: str, where: Sequence[ColumnElement[bool]] = (), **values: Any
) -> tuple[int, int] | None:
    """UPDATE the job row (guarded by `where`), taking the next event seq in the same
    statement. Returns (seq, attempt), or None when the guard matched nothing.

    The row lock of this UPDATE (PostgreSQL) or the database write lock (SQLite) serialises
    concurrent writers, so seqs are gap-free and unique per job.
    """
    stmt = (
        update(Job)
        .where(Job.id == job_id, *where)
        .values(event_seq=Job.event_seq + 1, **values)
        .returning(Job.event_seq, Job.attempt)
        .execution_options(synchronize_session=False)
    )
    row = session.execute(stmt).first()
    return None if row is None else (row[0], row[1])


def _event(
    session: Session, job_id: str, seq: int, kind: str, message: str, data: dict[str, Any] | None
) -> JobEvent:
    event = JobEvent(job_id=job_id, seq=seq, kind=kind, message=message, data=data)
    session.add(event)
    session.flush()
    return event


def add_event(
    session: Session, job_id: str, kind: str, message: str = "", data: dict[str, Any] | None = None
) -> JobEvent:
    """Append an event (kinds used: status, created, log, warning, error, checkpoint, metrics,
    data_quality ...). Raises LookupError for an unknown job."""
    taken = _bump_seq(session, job_id)
    if taken is None:
        raise LookupError(f"no job {job_id}")
    return _event(session, job_id, taken[0], kind, message, data)


def events_after(session: Session, job_id: str, after: int, limit: int) -> list[JobEvent]:
    """Up to `limit` events with seq > `after`, oldest first."""
    return list(
        session.execute(
            select(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.seq > after)
            .order_by(JobEvent.seq)
            .limit(limit)
        ).scalars()
    )


# The trainer's choice of how to run a job's batches (issue 25), as its `started` event says it
# (worker.progress copies it with the attempt) and a later `out_of_memory` event changes it.
TRAINING_FIELDS = (
    "grad_accum", "micro_batch", "activation_checkpointing", "compile",
    "memory_estimate_gib", "memory_available_gib", "attempt",
)  # fmt: skip
_CHANGED_BY_OUT_OF_MEMORY = ("grad_accum", "micro_batch")


def training_choice(session: Session, job_id: str) -> dict[str, Any] | None:
    """The newest `started` event's TRAINING_FIELDS, with the grad_accum and micro_batch of
    any later `out_of_memory` event; None before the trainer started (or a trainer that does
    not say). One query on the (job_id, seq) index; it reads the job's events from the newest
    `started` on, so it is for one job (GET /v1/jobs/{id}), not a page of them."""
    newest_start = (
        select(func.max(JobEvent.seq))
        .where(JobEvent.job_id == job_id, JobEvent.kind == "started")
        .scalar_subquery()
    )
    rows = session.execute(
        select(JobEvent.kind, JobEvent.data)
        .where(
            JobEvent.job_id == job_id,
            JobEvent.kind.in_(("started", OUT_OF_MEMORY_EVENT)),
            JobEvent.seq >= newest_start,
        )
        .order_by(JobEvent.seq)
    ).all()
    if not rows or not isinstance(rows[0].data, dict) or "grad_accum" not in rows[0].data:
        return None
    choice = {k: rows[0].data.get(k) for k in TRAINING_FIELDS}
    for _, data in rows[1:]:
        choice.update({k: data[k] for k in _CHANGED_BY_OUT_OF_MEMORY if k in (data or {})})
    return choice


def event_data(session: Session, job_id: str, kind: str) -> dict[str, Any] | None:
    """The data of the job's first event of `kind` (e.g. the `estimate` kept at create time),
    None when it has none. One query on the (job_id, seq) index."""
    data = session.execute(
        select(JobEvent.data)
        .where(JobEvent.job_id == job_id, JobEvent.kind == kind)
        .order_by(JobEvent.seq)
        .limit(1)
    ).scalar_one_or_none()
    return data if isinstance(data, dict) else None
