"""Leases: the one fencing scheme and the one claim/reap shape of every unit of work.

A table of leased work (jobs, evaluations) has the columns `status`, `attempt`,
`lease_owner`, `lease_expires_at`, `heartbeat_at` and `updated_at`. Its rows go

    queued ──claim──→ running ──finish──→ a terminal status
      ↑                  │
      └──reap (lease expired) / release (worker shutdown)

    claim    a guarded UPDATE: queued, or running with an expired lease (its worker died);
             attempt + 1, the lease to now + lease_seconds, owned by one worker id.
    renew    a heartbeat: UPDATE ... WHERE lease_owner = me AND status is leased. It matches
             nothing once the lease was lost (reaped, reclaimed): the caller stops at once.
    fence    every write of a running attempt goes in one transaction with a renew (see
             worker.attempt), so a zombie attempt whose lease was lost writes nothing.
    reap     running rows whose lease expired go back to `queued` (sent again), or fail once
             `attempt` reached the allowed number; each move guarded by the lease still
             being expired, so a late heartbeat wins over the reaper.
    stale    queued rows untouched for a while (a broker message lost between the commit
             and the send) are taken by one sweeper (touching updated_at) and sent again;
             a duplicate send is harmless: claim lets one delivery win.

models.jobs and models.evaluations build their transitions from these pieces (a job also
writes a `status` event with every move and has a `cancelling` state).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, or_, select, update
from sqlalchemy.orm import Session

from models.base import utcnow

LEASED_STATUSES = ("running", "cancelling")
CLEAR_LEASE: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None}


def worker_lost(attempt: int) -> dict[str, str]:
    """The error of a row the reaper fails: its worker was lost on every allowed attempt."""
    return {"type": "worker_lost", "message": f"the worker was lost {attempt} times; giving up"}


def expired(table: Any, now: datetime) -> ColumnElement[bool]:
    """The lease of a leased row has run out (or was never set)."""
    return or_(table.lease_expires_at.is_(None), table.lease_expires_at < now)


def claimable(table: Any, now: datetime) -> ColumnElement[bool]:
    """queued, or running with an expired lease: the rows a worker may claim."""
    return or_(table.status == "queued", and_(table.status == "running", expired(table, now)))


def claim_values(table: Any, worker_id: str, lease_seconds: float, now: datetime) -> dict[str, Any]:
    """What a claim sets: running, one more attempt, the lease."""
    return {
        "status": "running",
        "attempt": table.attempt + 1,
        "lease_owner": worker_id,
        "lease_expires_at": now + timedelta(seconds=lease_seconds),
        "heartbeat_at": now,
        "updated_at": now,
    }


def public_owner(owner: str | None) -> str | None:
    """A lease owner as a team-visible event names it: its last `:` part, the random part of
    worker.config.new_worker_id, never the host name and pid before it (DESIGN.md §6). The
    whole owner is in the lease column and the worker's log ("claimed (attempt N) by ...")."""
    return None if owner is None else owner.rsplit(":", 1)[-1]


def held_by(table: Any, worker_id: str) -> list[ColumnElement[bool]]:
    """The guard of every write a lease holder makes."""
    return [table.lease_owner == worker_id, table.status.in_(LEASED_STATUSES)]


def renew(
    session: Session,
    table: Any,
    row_id: str,
    worker_id: str,
    lease_seconds: float,
    *,
    now: datetime | None = None,
    **values: Any,
) -> str | None:
    """Extend `worker_id`'s lease (setting `values` too). Returns the row's status, or None
    when the lease is lost: stop without writing anything else."""
    now = now or utcnow()
    stmt = (
        update(table)
        .where(table.id == row_id, *held_by(table, worker_id))
        .values(lease_expires_at=now + timedelta(seconds=lease_seconds), heartbeat_at=now, **values)
        .returning(table.status)
        .execution_options(synchronize_session=False)
    )
    status = session.execute(stmt).scalar()
    expire_loaded(session, table, row_id)
    return status


def expired_rows(
    session: Session,
    table: Any,
    now: datetime,
    limit: int = 100,
    where: Sequence[ColumnElement[bool]] = (),
) -> list[Any]:
    """(id, status, lease_owner, attempt) of leased rows whose lease ran out, oldest first
    (`where`: further conditions)."""
    return list(
        session.execute(
            select(table.id, table.status, table.lease_owner, table.attempt)
            .where(table.status.in_(LEASED_STATUSES), table.lease_expires_at < now, *where)
            .order_by(table.lease_expires_at)
            .limit(limit)
        ).all()
    )


def stale_queued(
    session: Session, table: Any, older_than_seconds: float, *, now: datetime | None = None
) -> list[str]:
    """Queued rows untouched for `older_than_seconds`: their message may have been lost."""
    cutoff = (now or utcnow()) - timedelta(seconds=older_than_seconds)
    return list(
        session.execute(
            select(table.id)
            .where(table.status == "queued", table.updated_at < cutoff)
            .order_by(table.id)
        ).scalars()
    )


def take_stale_queued(
    session: Session, table: Any, older_than_seconds: float, *, now: datetime | None = None
) -> list[str]:
    """stale_queued, each row taken by one sweeper: touching updated_at with a guarded UPDATE
    means concurrent sweeps do not all re-send the same row, and a row waiting behind a long
    backlog is re-sent at most once per period."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=older_than_seconds)
    taken: list[str] = []
    for row_id in stale_queued(session, table, older_than_seconds, now=now):
        won = session.execute(
            update(table)
            .where(table.id == row_id, table.status == "queued", table.updated_at < cutoff)
            .values(updated_at=now)
            .execution_options(synchronize_session=False)
        ).rowcount  # type: ignore[attr-defined]
        if won:
            taken.append(row_id)
    return taken


def expire_loaded(session: Session, table: Any, row_id: str) -> None:
    """Bulk UPDATEs bypass the identity map; drop a stale loaded row so it is re-read."""
    row = session.identity_map.get(session.identity_key(table, row_id), None)
    if row is not None:
        session.expire(row)
