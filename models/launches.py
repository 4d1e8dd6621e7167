"""The lease of a multi-node job (launcher 'trainjob'): held by one reconcile at a time.

A multi-node job runs on the cluster, not in a worker process, so no worker holds its lease
for the whole run. The lease is held for one reconcile of the job (worker.reconcile):

    take       a guarded UPDATE: the row is running or cancelling, launcher 'trainjob', its
               lease expired (or handed back), and still owned by the owner and attempt read
               (the fencing token): two reconciles racing for one job, one wins.
    renew      every write of that reconcile goes in one transaction with an UPDATE guarded by
               owner AND attempt, so a reconcile that stalled past its lease (another took the
               job over, possibly into a new attempt) writes nothing.
    hand back  at the end of the reconcile: lease_expires_at = heartbeat_at = now, so the next
               reconcile (any worker) takes it at once. A lease that expired without being
               handed back (lease_expires_at > heartbeat_at) is a reconcile that crashed.

Run-job claims and the reaper leave running 'trainjob' rows alone (`not_reconciled`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, or_, select, update
from sqlalchemy.orm import Session

from models import leases
from models.base import utcnow
from models.tables import Job

TRAINJOB = "trainjob"


def not_reconciled() -> ColumnElement[bool]:
    """A row that is not a launched multi-node job: a claim or the reaper may move it (a
    queued 'trainjob' row is claimable: its next launch is a run_job's)."""
    return or_(Job.status == "queued", Job.launcher.is_distinct_from(TRAINJOB))


def reconciled_rows(session: Session, limit: int = 500) -> list[Any]:
    """(id, status, attempt, lease_owner, lease_expires_at, heartbeat_at) of every launched
    multi-node job, oldest lease first."""
    return list(
        session.execute(
            select(
                Job.id,
                Job.status,
                Job.attempt,
                Job.lease_owner,
                Job.lease_expires_at,
                Job.heartbeat_at,
            )
            .where(Job.launcher == TRAINJOB, Job.status.in_(leases.LEASED_STATUSES))
            .order_by(Job.lease_expires_at.asc().nulls_first(), Job.id)
            .limit(limit)
        ).all()
    )


def take(
    session: Session,
    job_id: str,
    worker_id: str,
    *,
    seen_owner: str | None,
    seen_attempt: int,
    lease_seconds: float,
    now: datetime | None = None,
) -> bool:
    """Take the job's lease for one reconcile (module docstring). False: someone else has it."""
    now = now or utcnow()
    owner = Job.lease_owner.is_(None) if seen_owner is None else Job.lease_owner == seen_owner
    won = session.execute(
        update(Job)
        .where(
            Job.id == job_id,
            Job.launcher == TRAINJOB,
            Job.status.in_(leases.LEASED_STATUSES),
            leases.expired(Job, now),
            owner,
            Job.attempt == seen_attempt,
        )
        .values(
            lease_owner=worker_id,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
            heartbeat_at=now,
        )
        .execution_options(synchronize_session=False)
    ).rowcount  # type: ignore[attr-defined]
    leases.expire_loaded(session, Job, job_id)
    return bool(won)


def renew(
    session: Session,
    job_id: str,
    worker_id: str,
    attempt: int,
    lease_seconds: float,
    *,
    now: datetime | None = None,
    new_attempt: int | None = None,
    **values: Any,
) -> str | None:
    """Extend the lease (setting `values`; `new_attempt`: the job moves on to that attempt),
    fenced by owner and attempt; the job's status, or None when the lease is lost."""
    now = now or utcnow()
    if new_attempt is not None:
        values["attempt"] = new_attempt
    status = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.attempt == attempt, *leases.held_by(Job, worker_id))
        .values(lease_expires_at=now + timedelta(seconds=lease_seconds), heartbeat_at=now, **values)
        .returning(Job.status)
        .execution_options(synchronize_session=False)
    ).scalar()
    leases.expire_loaded(session, Job, job_id)
    return status


def hand_back(
    session: Session, job_id: str, worker_id: str, attempt: int, **values: Any
) -> str | None:
    """End this reconcile's hold (setting `values`): the next reconcile takes it at once."""
    return renew(session, job_id, worker_id, attempt, 0.0, **values)


def handed_back(lease_expires_at: datetime | None, heartbeat_at: datetime | None) -> bool:
    """Whether a lease was ended by its holder (else it expired: that reconcile crashed)."""
    if lease_expires_at is None or heartbeat_at is None:
        return True
    return lease_expires_at <= heartbeat_at
