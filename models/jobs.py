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

The lease pieces are models.leases (shared with evaluations); events are models.job_events,
metrics and checkpoints models.job_records (both re-exported here).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import ColumnElement, Table, func, insert, literal, select
from sqlalchemy.orm import Session, make_transient_to_detached

from models import leases, webhooks
from models.base import UTCDateTime, new_id, utcnow
from models.job_events import _bump_seq, _event
from models.job_events import add_event as add_event
from models.job_events import events_after as events_after
from models.job_events import training_choice as training_choice
from models.job_records import add_checkpoint as add_checkpoint
from models.job_records import checkpoint_at as checkpoint_at
from models.job_records import checkpoints as checkpoints
from models.job_records import latest_checkpoint as latest_checkpoint
from models.job_records import metrics_between as metrics_between
from models.job_records import record_metrics as record_metrics
from models.launches import not_reconciled
from models.leases import CLEAR_LEASE
from models.quota import QUOTA_HEADROOM as QUOTA_HEADROOM
from models.quota import active_job_count as active_job_count
from models.quota import within_quota as within_quota
from models.tables import (
    TERMINAL_STATUSES,
    Job,
    JobEvent,
)

_JOBS = cast(Table, Job.__table__)  # plain INSERTs of create_job
_EVENTS = cast(Table, JobEvent.__table__)
TRANSITIONS: dict[str, frozenset[str]] = {
    "validating": frozenset({"queued", "failed", "cancelled"}),
    "queued": frozenset({"running", "cancelled", "failed"}),
    "running": frozenset({"queued", "cancelling", "succeeded", "failed"}),
    "cancelling": frozenset({"cancelled", "succeeded", "failed"}),
    "cancelled": frozenset(),
    "succeeded": frozenset(),
    "failed": frozenset(),
}


class InvalidTransition(ValueError):
    """A transition the state machine does not allow (a programming error, not a race)."""


def can_transition(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS.get(from_state, frozenset())


def is_terminal(status: str) -> bool:
    return status in TERMINAL_STATUSES


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
        values = {**CLEAR_LEASE, **values}
    elif to_state == "queued":
        values = {**CLEAR_LEASE, **values}
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
            if to_state in TERMINAL_STATUSES:  # its webhooks, in this same transaction
                webhooks.record_job_event(session, job_id, to_state)
            _expire(session, job_id)
            return True
    return False


def _expire(session: Session, job_id: str) -> None:
    leases.expire_loaded(session, Job, job_id)


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
    total_steps: int | None = None,
    estimate: dict[str, Any] | None = None,
) -> Job:
    """Insert a job that has passed validation: `queued`, with its `created` event (seq 1;
    its data: the spec, and the cost `estimate` when given) and the `status` event of its
    validating → queued transition (seq 2). Returns the row, persistent in `session`.

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
        "total_steps": total_steps,
        "runtime_seconds": 0.0,  # the API's estimate; the trainer's count replaces it
        "event_seq": 2,
        "error": None,
        "result": None,
        "created_at": now,
        "updated_at": now,
        "started_at": None,
        "finished_at": None,
    }
    session.execute(insert(_JOBS), {_column_of(k): v for k, v in columns.items()})
    event = {"job_id": columns["id"], "created_at": now}
    session.execute(
        insert(_EVENTS),
        [
            {
                **event,
                "seq": 1,
                "kind": "created",
                "message": "job created",
                "data": {"spec": spec} | ({"estimate": estimate} if estimate else {}),
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


def exported_model(job: Job) -> dict[str, Any] | None:
    """The model a job exported (`result["final_model"]`: its store `prefix` and `files`)
    when the job succeeded with one, else None. A succeeded job need not have one (a worker
    may finish it without an export): every place that shows or serves a job's model asks
    here, so none lists a model that cannot be downloaded."""
    if job.status != "succeeded":
        return None
    final = (job.result or {}).get("final_model")
    return final if isinstance(final, dict) and final else None


def exported_models(session: Session, team_id: str, limit: int = 1000) -> list[Job]:
    """The team's jobs that exported a model (exported_model), newest first; at most `limit`
    succeeded jobs are looked at."""
    succeeded = select(Job).where(Job.team_id == team_id, Job.status == "succeeded")
    jobs = session.scalars(succeeded.order_by(Job.id.desc()).limit(limit))
    return [job for job in jobs if exported_model(job) is not None]


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
    where: Sequence[ColumnElement[bool]] = (),
) -> Job | None:
    """Take a job for `worker_id`: queued → running, or running with an expired lease →
    running again (its previous worker died; resume from the last checkpoint).

    Increments `attempt`, sets the lease to now + lease_seconds and writes a `status` event.
    Returns the refreshed Job when this call won, None when the job is missing, finished,
    cancelling, validly leased by someone (a duplicate task delivery), or `where` (further
    guards: models.scheduling's team limit) does not hold: exit quietly then.
    """
    now = now or utcnow()
    row = session.execute(select(Job.status, Job.lease_owner).where(Job.id == job_id)).first()
    if row is None or row.status not in ("queued", "running"):
        return None
    taken = _bump_seq(  # guarded by the state just read: the event below says what it was
        session,
        job_id,
        # a launched multi-node job is reconciled, never re-claimed (models.launches)
        [Job.status == row.status, leases.claimable(Job, now), not_reconciled(), *where],
        **leases.claim_values(Job, worker_id, lease_seconds, now),
        started_at=func.coalesce(Job.started_at, literal(now, UTCDateTime())),
    )
    if taken is None:
        return None
    seq, attempt = taken
    data: dict[str, Any] = {
        "from": row.status,
        "to": "running",
        "attempt": attempt,
        "worker": leases.public_owner(worker_id),
    }
    message = f"{row.status} → running (attempt {attempt})"
    if row.status == "running":  # reclaimed
        previous = leases.public_owner(row.lease_owner)
        data["previous_worker"] = previous
        message = f"lease of worker {previous} expired; reclaimed (attempt {attempt})"
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
    runtime_seconds: float | None = None,
    now: datetime | None = None,
) -> str | None:
    """Renew `worker_id`'s lease (and record progress). Returns the job's status —
    "running", or "cancelling" when the user asked to stop (stop at the step boundary, save,
    then finish(..., "cancelled")) — or None when the lease is lost (reaped or reclaimed by
    another worker): stop at once without writing anything else.
    """
    values: dict[str, Any] = {}
    if current_step is not None:
        values["current_step"] = current_step
    if total_steps is not None:
        values["total_steps"] = total_steps
    if runtime_seconds is not None:
        values["runtime_seconds"] = runtime_seconds
    return leases.renew(session, Job, job_id, worker_id, lease_seconds, now=now, **values)


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
        final = result.get("final_model") or {}
        if isinstance(final.get("bytes"), int):  # the storage quota counts it (models.quota)
            fields["model_bytes"] = final["bytes"]
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
        data={"reason": reason, "worker": leases.public_owner(worker_id)},
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
    expired = leases.expired_rows(session, Job, now, limit, where=[not_reconciled()])
    still_expired = [Job.lease_expires_at < now]
    requeued: list[str] = []
    for job_id, status, lease_owner, attempt in expired:
        owner = f"worker {leases.public_owner(lease_owner)}"  # never its host and pid
        data = {"worker": leases.public_owner(lease_owner), "attempt": attempt}
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
                error=leases.worker_lost(attempt),
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
    return leases.stale_queued(session, Job, older_than_seconds, now=now)
