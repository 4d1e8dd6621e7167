"""Which queued job a free worker runs next: fair across teams, a limit per team, decided in
the database (DESIGN.md §6). No scheduler process: each worker decides when it claims.

A `run_job` message (Celery) or an embedded queue entry is a wake-up for one free worker
slot, not an order to run that very job. The worker claims the fairest claimable job of its
queue (`claim_next`):

    claimable   queued, and its team runs fewer than TEAM_MAX_RUNNING jobs (running or
                cancelling: what holds a worker), over all workers
    order       the team running the fewest jobs first, then the team whose last claim is
                oldest (round robin among equals), then the team's oldest queued job

so team A's 20 queued jobs do not keep team B's one waiting: B's job goes at the next free
slot, whichever message freed it. The one exception is a delivery of a job whose own worker
died (running, lease expired): it is reclaimed as before (it still counts for its team).

The limit is exact under concurrency. PostgreSQL: the claim locks its team's row first
(`FOR NO KEY UPDATE SKIP LOCKED`: a team being claimed by another worker is skipped, never
waited for, so claimers cannot deadlock), then moves the job with one guarded UPDATE whose
WHERE also counts the team's running jobs; the count runs after the lock, so it sees every
claim committed before. SQLite (the embedded worker): the lock clause is dropped, and the
one guarded UPDATE decides under SQLite's single writer lock.

A wake-up that finds nothing claimable is dropped: it never holds a worker slot. A job that
was blocked by its team's limit gets a fresh wake-up when one of its team's jobs ends
(`next_queued_of_team`, sent by the worker after the job's last write); the reaper's stale
sweep is the backstop for anything else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, func, select, update
from sqlalchemy.orm import Session, aliased

from models import jobs as job_states
from models.base import utcnow
from models.tables import Job, Team

HOLDING_A_WORKER = ("running", "cancelling")
PAGE = 200  # candidates read at a time (queued jobs of other queues are skipped in Python)
MAX_PAGES = 25

Routable = Callable[[Any], bool]  # a candidate row (id, team_id, base_model, meta) → ours?


@dataclass(frozen=True)
class Claimant:
    """Who claims (the worker's id and lease length) and what it may take: a team's running
    jobs stay under `max_running` (0: no limit), and `routable`, when set, accepts a
    candidate row (the worker's queue; None: any)."""

    worker_id: str
    lease_seconds: float
    max_running: int = 0
    routable: Routable | None = None


class Contended(Exception):
    """Nothing was claimed, but a team we skipped was being claimed by another worker at the
    same moment: try again (in a new transaction) rather than drop the wake-up."""


def running_counts(session: Session) -> dict[str, int]:
    """Jobs holding a worker, per team."""
    rows = session.execute(
        select(Job.team_id, func.count())
        .where(Job.status.in_(HOLDING_A_WORKER))
        .group_by(Job.team_id)
    ).all()
    return {team: n for team, n in rows}


def _team_running(team_id: Any) -> Any:
    other = aliased(Job)
    return (
        select(func.count())
        .select_from(other)
        .where(other.team_id == team_id, other.status.in_(HOLDING_A_WORKER))
        .scalar_subquery()
    )


def fair_candidates(
    session: Session, max_running: int, *, limit: int = PAGE, offset: int = 0
) -> list[Row[Any]]:
    """Queued jobs of teams under their limit, fairest first: (id, team_id, base_model, meta)."""
    running = (
        select(Job.team_id, func.count().label("n"))
        .where(Job.status.in_(HOLDING_A_WORKER))
        .group_by(Job.team_id)
        .subquery()
    )
    n = func.coalesce(running.c.n, 0)
    query = (
        select(Job.id, Job.team_id, Job.base_model, Job.meta)
        .join(Team, Team.id == Job.team_id)
        .outerjoin(running, running.c.team_id == Job.team_id)
        .where(Job.status == "queued")
    )
    if max_running > 0:
        query = query.where(n < max_running)
    query = query.order_by(n, Team.last_started_at.asc().nulls_first(), Job.created_at, Job.id)
    return list(session.execute(query.limit(limit).offset(offset)).all())


def _lock_team(session: Session, team_id: str) -> bool:
    """PostgreSQL: lock the team's row unless another claimer holds it (False then). The lock
    (NO KEY UPDATE) does not block inserting the team's jobs. SQLite: no-op, True."""
    locked = session.execute(
        select(Team.id).where(Team.id == team_id).with_for_update(key_share=True, skip_locked=True)
    ).first()
    return locked is not None


def claim_next(session: Session, who: Claimant, now: datetime | None = None) -> Job | None:
    """Claim the fairest claimable queued job that `who` may take. Returns the job
    (running, leased, with its `status` event), or None when nothing is claimable. Raises
    Contended when it skipped a team another worker was claiming at the same moment and
    claimed nothing: roll back and call again. Does not commit."""
    now = now or utcnow()
    tried: set[str] = set()
    contended = False
    max_running = who.max_running
    for page in range(MAX_PAGES):
        rows = fair_candidates(session, max_running, offset=page * PAGE)
        for row in rows:
            if row.team_id in tried or (who.routable is not None and not who.routable(row)):
                continue
            tried.add(row.team_id)
            if not _lock_team(session, row.team_id):
                contended = True
                continue
            guard = [_team_running(row.team_id) < max_running] if max_running > 0 else []
            job = job_states.claim(
                session, row.id, who.worker_id, who.lease_seconds, now=now, where=guard
            )
            if job is not None:
                session.execute(
                    update(Team).where(Team.id == row.team_id).values(last_started_at=now)
                )
                return job
            # Cancelled or claimed since we read it, or the team filled up: its other jobs
            # may still be claimable, so a retry must look again.
            contended = True
        if len(rows) < PAGE:
            break
    if contended:
        raise Contended()
    return None


def claim_for(
    session: Session, job_id: str, who: Claimant, now: datetime | None = None
) -> Job | None:
    """What a delivery of `job_id` claims: the job itself when its worker died (running with
    an expired lease: it already counts for its team), else the next fair job (claim_next)."""
    now = now or utcnow()
    own = session.execute(select(Job.status, Job.lease_expires_at).where(Job.id == job_id)).first()
    if own is not None and own.status == "running":
        if own.lease_expires_at is None or own.lease_expires_at < now:
            return job_states.claim(session, job_id, who.worker_id, who.lease_seconds, now=now)
    return claim_next(session, who, now)


def next_queued_of_team(session: Session, team_id: str) -> str | None:
    """The team's oldest queued job: the one to wake a worker for when a job of the team
    ends (a slot under its limit is free again)."""
    return session.execute(
        select(Job.id)
        .where(Job.team_id == team_id, Job.status == "queued")
        .order_by(Job.created_at, Job.id)
        .limit(1)
    ).scalar()
