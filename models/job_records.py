"""What a running job records (metrics, checkpoints) and the reads of them the API serves."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from models.base import utcnow
from models.job_events import add_event
from models.tables import Checkpoint, JobMetric


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


def metrics_between(
    session: Session, job_id: str, from_step: int, to_step: int | None, limit: int
) -> list[JobMetric]:
    """Up to `limit` steps' metrics with from_step <= step <= to_step, by step."""
    query = select(JobMetric).where(JobMetric.job_id == job_id, JobMetric.step >= from_step)
    if to_step is not None:
        query = query.where(JobMetric.step <= to_step)
    return list(session.execute(query.order_by(JobMetric.step).limit(limit)).scalars())


def checkpoints(session: Session, job_id: str) -> list[Checkpoint]:
    """Every checkpoint of the job, by step."""
    return list(
        session.execute(
            select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)
        ).scalars()
    )


def checkpoint_at(session: Session, job_id: str, step: int) -> Checkpoint | None:
    return session.execute(
        select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step == step)
    ).scalar_one_or_none()
