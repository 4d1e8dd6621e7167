"""The job state machine and the guarded updates the API and the workers share.

    validating → queued → running → succeeded | failed | cancelled
                   │         ├──→ cancelling → cancelled (| succeeded | failed)
                   │         └──→ queued   (lease expired or released: resume later)
                   └──→ cancelled

Every change of `jobs.status` is one guarded `UPDATE ... WHERE id = :id AND status = :seen`
(plus lease conditions where they matter), so two processes racing for the same job cannot
both win: the loser's UPDATE matches no row. Every transition also writes a `status` event.

None of these functions commit: the caller owns the transaction and commits (or rolls back)
so a transition and whatever it goes with (a checkpoint row, an idempotency record) land
together. Enqueue broker tasks only *after* the commit (DESIGN.md §5).

Worker loop, in short::

    job = claim(s, job_id, worker_id, settings.LEASE_SECONDS); s.commit()
    if job is None: return                      # someone else has it, or it is finished
    ... every HEARTBEAT_SECONDS / step boundary:
    status = heartbeat(s, job_id, worker_id, settings.LEASE_SECONDS, current_step=n); s.commit()
    if status is None: stop (lease lost)         if status == "cancelling": save, then
    finish(s, job_id, worker_id, "cancelled")    ... at the end finish(..., "succeeded", result=...)

and periodically, anywhere: `ids = reap_expired(s); s.commit(); for id in ids: enqueue(id)`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, bindparam, func, insert, literal, or_, select, update
from sqlalchemy.orm import Session, make_transient_to_detached

from models.base import UTCDateTime, new_id, utcnow
from models.tables import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    Checkpoint,
    Job,
    JobEvent,
    JobMetric,
    Team,
)

TRANSITIONS: dict[str, frozenset[str]] = {
    "validating": frozenset({"queued", "failed", "cancelled"}),
    "queued": frozenset({"running", "cancelled", "failed"}),
    "running": frozenset({"queued", "cancelling", "succeeded", "failed"}),
    "cancelling": frozenset({"cancelled", "succeeded", "failed"}),
    "cancelled": frozenset(),
    "succeeded": frozenset(),
    "failed": frozenset(),
}
LEASED_STATUSES = ("running", "cancelling")
_CLEAR_LEASE = {"lease_owner": None, "lease_expires_at": None}


class InvalidTransition(ValueError):
    """A transition the state machine does not allow (a programming error, not a race)."""


def can_transition(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS.get(from_state, frozenset())


def is_terminal(status: str) -> bool:
    return status in TERMINAL_STATUSES


# --- events -------------------------------------------------------------------------------


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


# --- transitions ----------------------------------------------------------------------------


def transition(
    session: Session,
    job_id: str,
    from_states: str | Iterable[str],
    to_state: str,
    *,
    owner: str | None = None,
    where: Sequence[ColumnElement[bool]] = (),
    message: str | None = None,
    data: dict[str, Any] | None = None,
    **fields: Any,
) -> bool:
    """Move a job from one of `from_states` to `to_state` if it is in one of them now.

    Returns True when this call made the move (and wrote its `status` event), False when the
    job is missing, in another state, or (with `owner`) no longer leased by `owner`. `fields`
    are further columns to set (error=..., result=...). Terminal states set finished_at and
    clear the lease; `queued` clears the lease. Raises InvalidTransition for a move that the
    state machine forbids whatever the race.
    """
    sources = (from_states,) if isinstance(from_states, str) else tuple(from_states)
    for source in sources:
        if not can_transition(source, to_state):
            raise InvalidTransition(f"{source} → {to_state} is not a job transition")
    now = utcnow()
    values: dict[str, Any] = {"status": to_state, "updated_at": now, **fields}
    if to_state in TERMINAL_STATUSES:
        values.setdefault("finished_at", now)
        values = {**_CLEAR_LEASE, **values}
    elif to_state == "queued":
        values = {**_CLEAR_LEASE, **values}
    # Optimistic loop: read the state, UPDATE guarded by exactly that state. A concurrent
    # change makes the UPDATE match nothing; re-read and decide again (bounded: each retry
    # means the job moved, and it can only move a few times).
    for _ in range(len(TRANSITIONS) + 1):
        row = session.execute(select(Job.status, Job.lease_owner).where(Job.id == job_id)).first()
        if row is None or row.status not in sources:
            return False
        if owner is not None and row.lease_owner != owner:
            return False
        guard = [Job.status == row.status, *where]
        if owner is not None:
            guard.append(Job.lease_owner == owner)
        taken = _bump_seq(session, job_id, guard, **values)
        if taken is not None:
            _event(
                session,
                job_id,
                taken[0],
                "status",
                message or f"{row.status} → {to_state}",
                {"from": row.status, "to": to_state, **(data or {})},
            )
            _expire(session, job_id)
            return True
    return False


def _expire(session: Session, job_id: str) -> None:
    """Bulk UPDATEs bypass the identity map; drop a stale loaded Job so it is re-read."""
    job = session.identity_map.get(session.identity_key(Job, job_id), None)  # type: ignore[arg-type]
    if job is not None:
        session.expire(job)


def _column_of(attribute: str) -> str:
    """The column name of a Job attribute (`meta` is the column `metadata`)."""
    return Job.__mapper__.column_attrs[attribute].columns[0].key


def create_job(
    session: Session,
    *,
    team_id: str,
    spec: dict[str, Any],
    metadata: dict[str, Any] | None = None,
    training_file_id: str | None = None,
) -> Job:
    """Insert a job that has passed validation: `queued`, with its `created` event (seq 1)
    and the `status` event of its validating → queued transition (seq 2). Returns the row,
    persistent in `session`.

    The caller has validated the spec; commit, then enqueue the job id. The row is written
    directly in its committed state (nothing outside this transaction can see a new job, so
    `validating` is never observable), with two plain INSERTs rather than an ORM flush, a
    guarded transition and a re-read: this is most of the work of POST /v1/jobs.
    """
    now = utcnow()
    columns: dict[str, Any] = {
        "id": new_id("job"),
        "team_id": team_id,
        "status": "queued",
        "spec": spec,
        "meta": dict(metadata or {}),
        "base_model": str(spec.get("base_model", "")),
        "objective": str((spec.get("objective") or {}).get("name", "")),
        "training_file_id": training_file_id,
        "attempt": 0,
        "lease_owner": None,
        "lease_expires_at": None,
        "heartbeat_at": None,
        "current_step": 0,
        "total_steps": None,
        "event_seq": 2,
        "error": None,
        "result": None,
        "created_at": now,
        "updated_at": now,
        "started_at": None,
        "finished_at": None,
    }
    session.execute(insert(Job.__table__), {_column_of(k): v for k, v in columns.items()})
    event = {"job_id": columns["id"], "created_at": now}
    session.execute(
        insert(JobEvent.__table__),
        [
            {
                **event,
                "seq": 1,
                "kind": "created",
                "message": "job created",
                "data": {"spec": spec},
            },
            {
                **event,
                "seq": 2,
                "kind": "status",
                "message": "validating → queued",
                "data": {"from": "validating", "to": "queued"},
            },
        ],
    )
    job = Job(**columns)  # every column set: the instance is exactly the row just written
    make_transient_to_detached(job)
    session.add(job)  # persistent, without SQL
    return job


def request_cancel(session: Session, job_id: str) -> str | None:
    """Cancel for the API: a job that has not started is cancelled at once, a running one
    becomes `cancelling` (its worker stops at the next step boundary and saves a checkpoint).

    Returns the job's status afterwards, or None when it had already ended (or is missing).
    Repeating a cancel on a cancelling job is not an error.
    """
    for _ in range(len(TRANSITIONS) + 1):
        status = session.execute(select(Job.status).where(Job.id == job_id)).scalar()
        if status is None or status in TERMINAL_STATUSES:
            return None
        if status == "cancelling":
            return status
        if status in ("validating", "queued"):
            if transition(session, job_id, status, "cancelled", message="cancelled by user"):
                return "cancelled"
        elif transition(session, job_id, "running", "cancelling", message="cancellation requested"):
            return "cancelling"
    return None  # pragma: no cover - the job kept moving under us


# --- leases (workers) -----------------------------------------------------------------------


def claim(
    session: Session,
    job_id: str,
    worker_id: str,
    lease_seconds: float,
    *,
    now: datetime | None = None,
) -> Job | None:
    """Take a job for `worker_id`: queued → running, or running with an expired lease →
    running again (its previous worker died; resume from the last checkpoint).

    Increments `attempt`, sets the lease to now + lease_seconds and writes a `status` event.
    Returns the refreshed Job when this call won, None when the job is missing, finished,
    cancelling, or validly leased by someone (a duplicate task delivery): exit quietly then.
    """
    now = now or utcnow()
    row = session.execute(
        select(Job.status, Job.lease_owner, Job.lease_expires_at).where(Job.id == job_id)
    ).first()
    if row is None:
        return None
    if row.status == "queued":
        guard: list[ColumnElement[bool]] = [Job.status == "queued"]
        reclaimed = False
    elif row.status == "running" and (row.lease_expires_at is None or row.lease_expires_at < now):
        guard = [
            Job.status == "running",
            or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < now),
        ]
        reclaimed = True
    else:
        return None
    taken = _bump_seq(
        session,
        job_id,
        guard,
        status="running",
        attempt=Job.attempt + 1,
        lease_owner=worker_id,
        lease_expires_at=now + timedelta(seconds=lease_seconds),
        heartbeat_at=now,
        started_at=func.coalesce(Job.started_at, literal(now, UTCDateTime())),
        updated_at=now,
    )
    if taken is None:
        return None
    seq, attempt = taken
    data: dict[str, Any] = {
        "from": row.status,
        "to": "running",
        "attempt": attempt,
        "worker": worker_id,
    }
    message = f"{row.status} → running (attempt {attempt})"
    if reclaimed:
        data["previous_worker"] = row.lease_owner
        message = f"lease of {row.lease_owner} expired; reclaimed (attempt {attempt})"
    _event(session, job_id, seq, "status", message, data)
    return session.get(Job, job_id, populate_existing=True)


def heartbeat(
    session: Session,
    job_id: str,
    worker_id: str,
    lease_seconds: float,
    *,
    current_step: int | None = None,
    total_steps: int | None = None,
    now: datetime | None = None,
) -> str | None:
    """Renew `worker_id`'s lease (and record progress). Returns the job's status —
    "running", or "cancelling" when the user asked to stop (stop at the step boundary, save,
    then finish(..., "cancelled")) — or None when the lease is lost (reaped or reclaimed by
    another worker): stop at once without writing anything else.
    """
    now = now or utcnow()
    values: dict[str, Any] = {
        "lease_expires_at": now + timedelta(seconds=lease_seconds),
        "heartbeat_at": now,
    }
    if current_step is not None:
        values["current_step"] = current_step
    if total_steps is not None:
        values["total_steps"] = total_steps
    stmt = (
        update(Job)
        .where(Job.id == job_id, Job.lease_owner == worker_id, Job.status.in_(LEASED_STATUSES))
        .values(**values)
        .returning(Job.status)
        .execution_options(synchronize_session=False)
    )
    status = session.execute(stmt).scalar()
    _expire(session, job_id)
    return status


def finish(
    session: Session,
    job_id: str,
    worker_id: str,
    status: str,
    *,
    error: dict[str, Any] | None = None,
    result: dict[str, Any] | None = None,
    message: str | None = None,
) -> bool:
    """End a job the worker holds: succeeded or failed (from running or cancelling), or
    cancelled (from cancelling, after the worker saw it in heartbeat()). `error` is
    {"message", "type", ...}; `result` whatever the job produced (final checkpoint, report).
    Returns False when the worker no longer holds the lease (another attempt owns the job)."""
    if status not in TERMINAL_STATUSES:
        raise InvalidTransition(f"finish() takes a terminal status, not {status}")
    fields: dict[str, Any] = {}
    if error is not None:
        fields["error"] = error
    if result is not None:
        fields["result"] = result
    sources = ("cancelling",) if status == "cancelled" else ("running", "cancelling")
    return transition(session, job_id, sources, status, owner=worker_id, message=message, **fields)


def release(session: Session, job_id: str, worker_id: str, reason: str = "released") -> bool:
    """Give a running job back to the queue (worker shutdown, pause): running → queued.
    Enqueue it again after the commit; it resumes from its last checkpoint."""
    return transition(
        session,
        job_id,
        "running",
        "queued",
        owner=worker_id,
        message=reason,
        data={"reason": reason, "worker": worker_id},
    )


def reap_expired(
    session: Session,
    *,
    now: datetime | None = None,
    max_attempts: int | None = None,
    limit: int = 100,
) -> list[str]:
    """Handle jobs whose worker stopped heart-beating (lease_expires_at < now).

    running → queued (returned: enqueue these after the commit so they resume), or → failed
    when `attempt` reached `max_attempts` (a job that keeps killing its worker);
    cancelling → cancelled (the user wanted it stopped anyway). Each move is guarded by the
    lease still being expired, so a late heartbeat wins over the reaper.
    """
    now = now or utcnow()
    expired = session.execute(
        select(Job.id, Job.status, Job.lease_owner, Job.attempt)
        .where(Job.status.in_(LEASED_STATUSES), Job.lease_expires_at < now)
        .order_by(Job.lease_expires_at)
        .limit(limit)
    ).all()
    still_expired = [Job.lease_expires_at < now]
    requeued: list[str] = []
    for job_id, status, owner, attempt in expired:
        data = {"worker": owner, "attempt": attempt}
        if status == "cancelling":
            transition(
                session,
                job_id,
                "cancelling",
                "cancelled",
                where=still_expired,
                message=f"lease of {owner} expired while cancelling",
                data=data,
            )
        elif max_attempts is not None and attempt >= max_attempts:
            transition(
                session,
                job_id,
                "running",
                "failed",
                where=still_expired,
                message=f"lease of {owner} expired; {attempt} attempts exhausted",
                data=data,
                error={
                    "type": "worker_lost",
                    "message": f"the worker was lost {attempt} times; giving up",
                },
            )
        elif transition(
            session,
            job_id,
            "running",
            "queued",
            where=still_expired,
            message=f"lease of {owner} expired; requeued",
            data=data,
        ):
            requeued.append(job_id)
    return requeued


def stale_queued(
    session: Session, older_than_seconds: float, *, now: datetime | None = None
) -> list[str]:
    """Queued jobs untouched for a while: their broker message may have been lost (a crash
    between the commit and the send). Enqueuing them again is safe: claim() lets one win."""
    cutoff = (now or utcnow()) - timedelta(seconds=older_than_seconds)
    return list(
        session.execute(
            select(Job.id).where(Job.status == "queued", Job.updated_at < cutoff).order_by(Job.id)
        ).scalars()
    )


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


# --- what a running job records ------------------------------------------------------------


def record_metrics(session: Session, job_id: str, step: int, values: dict[str, Any]) -> None:
    """Store the metrics of one step, merged into what that step already has (a resumed job
    logs a replayed step again; the newest values win)."""
    existing = session.execute(
        select(JobMetric).where(JobMetric.job_id == job_id, JobMetric.step == step)
    ).scalar_one_or_none()
    if existing is None:
        session.add(JobMetric(job_id=job_id, step=step, values=dict(values)))
    else:
        existing.values = {**existing.values, **values}
    session.flush()


def add_checkpoint(
    session: Session,
    job_id: str,
    step: int,
    object_prefix: str,
    *,
    bytes: int = 0,
    files: list[str] | None = None,
) -> Checkpoint:
    """Register a checkpoint whose objects are already written under `object_prefix`
    (storage.keys.checkpoint_prefix(team, job, step)); re-registering a step replaces it.
    Writes a `checkpoint` event."""
    ckpt = session.execute(
        select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step == step)
    ).scalar_one_or_none()
    if ckpt is None:
        ckpt = Checkpoint(job_id=job_id, step=step, object_prefix=object_prefix)
        session.add(ckpt)
    ckpt.object_prefix = object_prefix
    ckpt.bytes = bytes
    ckpt.files = list(files) if files is not None else None
    ckpt.created_at = utcnow()
    session.flush()
    add_event(
        session,
        job_id,
        "checkpoint",
        f"checkpoint saved at step {step}",
        {"step": step, "bytes": bytes},
    )
    return ckpt


def latest_checkpoint(session: Session, job_id: str) -> Checkpoint | None:
    """The checkpoint to resume from (highest step)."""
    return session.execute(
        select(Checkpoint)
        .where(Checkpoint.job_id == job_id)
        .order_by(Checkpoint.step.desc())
        .limit(1)
    ).scalar_one_or_none()
