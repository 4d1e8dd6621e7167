"""The ORM tables (SQLAlchemy 2, typed). Every row that users see belongs to a team.

Statuses are plain strings guarded by CHECK constraints (portable, and readable in psql);
their allowed moves live in models/jobs.py.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, get_args

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from models.base import Base, JSONType, new_id, utcnow

# Each set once, as the type the API's schemas declare and the tuple the CHECKs hold.
JobStatus = Literal[
    "validating", "queued", "running", "cancelling", "cancelled", "succeeded", "failed"
]
JOB_STATUSES: tuple[str, ...] = get_args(JobStatus)
TERMINAL_STATUSES = ("cancelled", "succeeded", "failed")
ACTIVE_STATUSES = ("validating", "queued", "running", "cancelling")
# "fine-tune" is OpenAI's name for a training file (files.create from the openai package)
FilePurpose = Literal["train", "eval", "fine-tune"]
FILE_PURPOSES: tuple[str, ...] = get_args(FilePurpose)
TRAINING_PURPOSES = ("train", "fine-tune")
FileStatus = Literal["uploaded", "processed", "error"]
FILE_STATUSES: tuple[str, ...] = get_args(FileStatus)
EvalStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
EVAL_STATUSES: tuple[str, ...] = get_args(EvalStatus)
EVAL_ACTIVE_STATUSES = ("queued", "running")
EVAL_TERMINAL_STATUSES = ("succeeded", "failed", "cancelled")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Team(Base):
    __tablename__ = "teams"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("team"))
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # When a worker last claimed one of the team's jobs: among teams running as many jobs,
    # the one served longest ago goes first (models.scheduling).
    last_started_at: Mapped[datetime | None]


class ApiKey(Base):
    """An API key: only sha256(secret) is stored, plus a short prefix to tell keys apart."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("key"))
    team_id: Mapped[str] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    name: Mapped[str | None] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16))
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]

    team: Mapped[Team] = relationship(lazy="joined")


class File(Base):
    """An uploaded JSONL file; the bytes live in the object store under `object_key`."""

    __tablename__ = "files"
    __table_args__ = (
        CheckConstraint(_in("purpose", FILE_PURPOSES), name="purpose"),
        CheckConstraint(_in("status", FILE_STATUSES), name="status"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("file"))
    team_id: Mapped[str] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    filename: Mapped[str] = mapped_column(String(255))  # display only, never part of a key
    purpose: Mapped[str] = mapped_column(String(16))
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    format: Mapped[str | None] = mapped_column(String(32))
    records: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), default="uploaded")
    warnings: Mapped[list[str] | None]  # e.g. columns the format does not read
    error: Mapped[dict[str, Any] | None]
    # Prompt files: which lines hold which fields (contract.items.FieldProfile), so a job
    # whose grader reads a field some line lacks is refused at creation (migration 0008).
    item_fields: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    object_key: Mapped[str] = mapped_column(String(512))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    """A training job. The DB row, not the broker, is the source of truth (DESIGN.md §5).

    Lease columns: a worker owns a running job while `lease_expires_at` is in the future and
    renews it with heartbeats; an expired lease means the worker died and the job is requeued.
    `event_seq` is the last seq handed to this job's events (see models.jobs.add_event).
    """

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(_in("status", JOB_STATUSES), name="status"),
        Index("ix_jobs_team_id_id", "team_id", "id"),
        # The per-team quota counts active jobs on every POST /v1/jobs: an index-only scan
        # of the team's active entries, not a heap visit of every job the team ever ran.
        Index("ix_jobs_team_id_status", "team_id", "status"),
        Index("ix_jobs_status_lease_expires_at", "status", "lease_expires_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("job"))
    team_id: Mapped[str] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16), default="validating")
    spec: Mapped[dict[str, Any]]
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType, default=dict)
    base_model: Mapped[str] = mapped_column(String(255))
    objective: Mapped[str] = mapped_column(String(16))
    training_file_id: Mapped[str | None] = mapped_column(
        ForeignKey("files.id", ondelete="SET NULL"), index=True
    )
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime | None]
    current_step: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int | None] = mapped_column(Integer)
    # Wall-clock seconds the job has run, all attempts together (renewed with the lease):
    # what the job's max_runtime is checked against.
    runtime_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    event_seq: Mapped[int] = mapped_column(Integer, default=0)
    # Bytes of the exported model (result.final_model) in the object store: a team's storage
    # quota counts them with its files and checkpoints (models.quota.storage_use).
    model_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    error: Mapped[dict[str, Any] | None]
    result: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    # NULL: the worker runs the job itself; 'trainjob': a multi-node job, launched on the
    # cluster and followed by worker.reconcile (models.launches), decided at its first launch.
    launcher: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # The reconcile state of the current attempt's launch (worker.reconcile.LaunchState).
    launch: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)


class OfAJob:
    """The columns every row that belongs to one job has (deleted with it)."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobEvent(OfAJob, Base):
    """One line of a job's history; `seq` is 1, 2, 3... per job (the SSE event id)."""

    __tablename__ = "job_events"
    __table_args__ = (UniqueConstraint("job_id", "seq"),)

    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any] | None]


class JobMetric(OfAJob, Base):
    """Training metrics of one optimizer step (loss, rewards, clip fraction, KL, ...)."""

    __tablename__ = "job_metrics"
    __table_args__ = (UniqueConstraint("job_id", "step"),)

    step: Mapped[int] = mapped_column(Integer)
    values: Mapped[dict[str, Any]]


class Checkpoint(OfAJob, Base):
    """A saved checkpoint: its objects live under `object_prefix` ({team}/{job}/step-{n}/)."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step"),)

    step: Mapped[int] = mapped_column(Integer)
    object_prefix: Mapped[str] = mapped_column(String(512))
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    files: Mapped[list[str] | None]  # file names under the prefix, when the worker lists them


class Evaluation(Base):
    """An evaluation of a checkpoint (or of a base model) on an eval file.

    Leased like a job (models.leases): a worker owns a running evaluation while
    `lease_expires_at` is in the future; an expired lease means it died, and the reaper
    queues the evaluation again."""

    __tablename__ = "evaluations"
    __table_args__ = (
        CheckConstraint(_in("status", EVAL_STATUSES), name="status"),
        Index("ix_evaluations_team_id_id", "team_id", "id"),
        Index("ix_evaluations_status_lease_expires_at", "status", "lease_expires_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("eval"))
    team_id: Mapped[str] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    job_id: Mapped[str | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    checkpoint_id: Mapped[int | None] = mapped_column(
        ForeignKey("checkpoints.id", ondelete="SET NULL")
    )
    base_model: Mapped[str | None] = mapped_column(String(255))
    file_id: Mapped[str | None] = mapped_column(ForeignKey("files.id", ondelete="SET NULL"))
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    config: Mapped[dict[str, Any] | None]
    result: Mapped[dict[str, Any] | None]
    error: Mapped[dict[str, Any] | None]
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]


class IdempotencyKey(Base):
    """The remembered response of a POST made with an Idempotency-Key.

    Written in the same transaction as the object the POST created, so a retried request
    either sees both or neither; the unique (team_id, key) settles concurrent first tries.
    """

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("team_id", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    team_id: Mapped[str] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(255))
    method_path: Mapped[str] = mapped_column(String(300))
    request_hash: Mapped[str] = mapped_column(String(64))
    response_status: Mapped[int] = mapped_column(Integer)
    response_body: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
