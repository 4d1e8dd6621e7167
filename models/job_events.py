"""A job's events: a gap-free `seq` per job, taken with the UPDATE of the job row itself.

Kinds used: status, created, log, warning, error, checkpoint, metrics, data_quality, ... (see
models.jobs for the `status` events of transitions and contract.runs for the trainer's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

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
