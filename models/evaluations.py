"""The evaluation's life cycle, on the leases of models.leases (the same as a job's):

    queued → running → succeeded | failed
               └──→ queued   (lease expired: run again, at most max_attempts times)

Like models.jobs, none of these commit: the caller owns the transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from models import leases, webhooks
from models.base import utcnow
from models.leases import CLEAR_LEASE
from models.tables import EVAL_ACTIVE_STATUSES, EVAL_TERMINAL_STATUSES, Evaluation


def claim(
    session: Session,
    evaluation_id: str,
    worker_id: str,
    lease_seconds: float,
    *,
    now: datetime | None = None,
) -> Evaluation | None:
    """queued → running, or take over a running evaluation whose lease expired (its worker
    died). Returns the refreshed row when this call won, None otherwise (finished, or
    leased by a live worker: a duplicate delivery)."""
    now = now or utcnow()
    won = session.execute(
        update(Evaluation)
        .where(Evaluation.id == evaluation_id, leases.claimable(Evaluation, now))
        .values(**leases.claim_values(Evaluation, worker_id, lease_seconds, now), error=None)
        .execution_options(synchronize_session=False)
    ).rowcount  # type: ignore[attr-defined]
    if not won:
        return None
    return session.get(Evaluation, evaluation_id, populate_existing=True)


def heartbeat(
    session: Session,
    evaluation_id: str,
    worker_id: str,
    lease_seconds: float,
    *,
    progress: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> str | None:
    """Renew the lease (copying the evaluation's progress into result.progress). Returns
    the status, or None when the lease is lost."""
    values: dict[str, Any] = {"result": {"progress": progress}} if progress else {}
    return leases.renew(
        session, Evaluation, evaluation_id, worker_id, lease_seconds, now=now, **values
    )


Doc = dict[str, Any]


def finish(
    session: Session, evaluation_id: str, worker_id: str, status: str, *,
    error: Doc | None = None, result: Doc | None = None,
) -> bool:  # fmt: skip
    """End an evaluation the worker holds. False when it no longer holds the lease."""
    if status not in EVAL_TERMINAL_STATUSES:
        raise ValueError(f"finish() takes a terminal status, not {status}")
    now = utcnow()
    values: dict[str, Any] = {
        "status": status, "error": error, "updated_at": now, "finished_at": now
    }
    if result is not None:
        values["result"] = result
    won = session.execute(
        update(Evaluation)
        .where(Evaluation.id == evaluation_id, *leases.held_by(Evaluation, worker_id))
        .values(**CLEAR_LEASE, **values)
        .execution_options(synchronize_session=False)
    ).rowcount  # type: ignore[attr-defined]
    if won:  # its webhooks, in this same transaction
        webhooks.record_evaluation_event(session, evaluation_id, status)
    leases.expire_loaded(session, Evaluation, evaluation_id)
    return bool(won)


def release(session: Session, evaluation_id: str, worker_id: str) -> bool:
    """Give a running evaluation back to the queue (worker shutdown): running → queued."""
    won = session.execute(
        update(Evaluation)
        .where(Evaluation.id == evaluation_id, *leases.held_by(Evaluation, worker_id))
        .values(status="queued", updated_at=utcnow(), **CLEAR_LEASE)
        .execution_options(synchronize_session=False)
    ).rowcount  # type: ignore[attr-defined]
    leases.expire_loaded(session, Evaluation, evaluation_id)
    return bool(won)


def reap_expired(
    session: Session, *, now: datetime | None = None, max_attempts: int | None = None,
    limit: int = 100,
) -> list[str]:  # fmt: skip
    """Evaluations whose worker stopped heart-beating: running → queued (returned: send them
    again after the commit), or → failed once `attempt` reached `max_attempts`."""
    now = now or utcnow()
    requeued: list[str] = []
    for row_id, _status, _owner, attempt in leases.expired_rows(session, Evaluation, now, limit):
        guard = [
            Evaluation.id == row_id,
            Evaluation.status == "running",
            leases.expired(Evaluation, now),
        ]
        if max_attempts is not None and attempt >= max_attempts:
            values: dict[str, Any] = {
                "status": "failed",
                "finished_at": now,
                "error": leases.worker_lost(attempt),
            }
        else:
            values = {"status": "queued"}
        won = session.execute(
            update(Evaluation)
            .where(*guard)
            .values(updated_at=now, **CLEAR_LEASE, **values)
            .execution_options(synchronize_session=False)
        ).rowcount  # type: ignore[attr-defined]
        if won and values["status"] == "queued":
            requeued.append(row_id)
        elif won:
            webhooks.record_evaluation_event(session, row_id, "failed")
    return requeued


def active_count(session: Session, team_id: str) -> int:
    """The team's queued or running evaluations (the MAX_EVALS_PER_TEAM quota)."""
    return session.execute(
        select(func.count())
        .select_from(Evaluation)
        .where(Evaluation.team_id == team_id, Evaluation.status.in_(EVAL_ACTIVE_STATUSES))
    ).scalar_one()
