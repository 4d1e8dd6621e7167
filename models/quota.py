"""Per-team quotas: active jobs (MAX_JOBS_PER_TEAM), evaluations (MAX_EVALS_PER_TEAM) and
stored bytes (TEAM_STORAGE_QUOTA_GIB)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from models.tables import ACTIVE_STATUSES, Checkpoint, Evaluation, File, Job, Team

_ACTIVE = select(Job.id).where(
    Job.team_id == bindparam("team_id"), Job.status.in_(ACTIVE_STATUSES)
)
_COUNT_ACTIVE = select(func.count()).select_from(_ACTIVE.subquery())
_COUNT_ACTIVE_UPTO = select(func.count()).select_from(
    _ACTIVE.limit(bindparam("limit")).subquery()
)
_LOCK_TEAM = (
    select(Team.id).where(Team.id == bindparam("team_id")).with_for_update(key_share=True)
)


def active_job_count(session: Session, team_id: str, limit: int | None = None) -> int:
    """The team's active jobs, counted up to `limit` when given (enough to enforce a quota
    without counting every row of a team with many). The statements are built once: every
    job creation runs them."""
    if limit is None:
        return session.execute(_COUNT_ACTIVE, {"team_id": team_id}).scalar_one()
    return session.execute(_COUNT_ACTIVE_UPTO, {"team_id": team_id, "limit": limit}).scalar_one()


# More creates of one team than this cannot be in flight at once: each holds a database
# connection, and PostgreSQL's default max_connections is 100.
QUOTA_HEADROOM = 128


def within_quota(session: Session, team_id: str, limit: int) -> bool:
    """Whether the team's active jobs, the caller's new (uncommitted) one included, are at
    most `limit`. Call it last before committing the new job.

    Far from the limit, one unlocked count decides: concurrent creates each see at least the
    jobs committed before them plus their own, so if every one of them saw room for
    QUOTA_HEADROOM more, all of them together still fit. Near the limit the team's row is
    locked first (FOR NO KEY UPDATE, until the commit) and the count repeated, so concurrent
    creates count one after the other, exactly. (A lock on every create serialised a busy
    team's POSTs across API processes: p99 grew tenfold at 60 creates/s.) SQLite ignores the
    lock; its writers are serialised anyway."""
    far = limit > QUOTA_HEADROOM  # a small quota is always near: lock at once
    if far and active_job_count(session, team_id, limit + 1) + QUOTA_HEADROOM <= limit:
        return True
    session.execute(_LOCK_TEAM, {"team_id": team_id})
    return active_job_count(session, team_id, limit + 1) <= limit


# --- evaluations (MAX_EVALS_PER_TEAM) ----------------------------------------------------------
_ACTIVE_EVALS_UPTO = select(func.count()).select_from(
    select(Evaluation.id)
    .where(Evaluation.team_id == bindparam("team_id"), Evaluation.status.in_(("queued", "running")))
    .limit(bindparam("limit"))
    .subquery()
)


def within_eval_quota(session: Session, team_id: str, limit: int) -> bool:
    """Whether the team's queued or running evaluations, the caller's new (flushed, uncommitted)
    ones included, are at most `limit`: the job quota's scheme with the lock always taken
    (evaluation quotas are small). Insert first, then call this last before committing: on
    PostgreSQL the team row's lock orders concurrent creates; on SQLite the insert took the
    write lock, so the count sees every row committed before it. A check-then-insert made 12
    under a limit of 10 from 30 concurrent creates."""
    session.execute(_LOCK_TEAM, {"team_id": team_id})
    count = session.execute(_ACTIVE_EVALS_UPTO, {"team_id": team_id, "limit": limit + 1})
    return count.scalar_one() <= limit


# --- storage (TEAM_STORAGE_QUOTA_GIB) ----------------------------------------------------------
@dataclass(frozen=True)
class StorageUse:
    """A team's stored bytes, as the database records them: uploaded files, checkpoints and
    exported models (a succeeded job's `model_bytes`)."""

    files: int
    checkpoints: int
    models: int

    @property
    def total(self) -> int:
        return self.files + self.checkpoints + self.models


_STORAGE_USE = select(
    select(func.coalesce(func.sum(File.bytes), 0))
    .where(File.team_id == bindparam("team_id"))
    .scalar_subquery(),
    select(func.coalesce(func.sum(Checkpoint.bytes), 0))
    .select_from(Checkpoint)
    .join(Job, Job.id == Checkpoint.job_id)
    .where(Job.team_id == bindparam("team_id"))
    .scalar_subquery(),
    select(func.coalesce(func.sum(Job.model_bytes), 0))
    .where(Job.team_id == bindparam("team_id"))
    .scalar_subquery(),
)


def storage_use(session: Session, team_id: str) -> StorageUse:
    """The team's stored bytes (one statement, built once: every upload runs it)."""
    files, checkpoints, models = session.execute(_STORAGE_USE, {"team_id": team_id}).one()
    return StorageUse(int(files), int(checkpoints), int(models))


def within_storage_quota(session: Session, team_id: str, limit: int) -> tuple[bool, StorageUse]:
    """Whether the team's stored bytes, the caller's new (flushed, uncommitted) file row
    included, are at most `limit`, and what they are: the evaluation quota's scheme. Insert
    first, then call this last before committing: on PostgreSQL the team row's lock (FOR NO
    KEY UPDATE, until the commit) makes concurrent uploads of one team count one after the
    other, each seeing the rows committed before it; on SQLite the insert took the write lock.
    A caller refused here rolls back and removes the object it stored."""
    session.execute(_LOCK_TEAM, {"team_id": team_id})
    use = storage_use(session, team_id)
    return use.total <= limit, use
