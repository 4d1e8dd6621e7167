"""Database layer: ORM tables, engine/session helpers, the job state machine, settings.

Imports SQLAlchemy and pydantic only (the API and the worker both use it; never torch).
"""

from models.base import Base, new_id, utcnow
from models.db import make_engine, make_session_factory, session_scope
from models.tables import (
    ACTIVE_STATUSES,
    JOB_STATUSES,
    TERMINAL_STATUSES,
    ApiKey,
    Checkpoint,
    Evaluation,
    File,
    IdempotencyKey,
    Job,
    JobEvent,
    JobMetric,
    Team,
)

__all__ = [
    "ACTIVE_STATUSES",
    "JOB_STATUSES",
    "TERMINAL_STATUSES",
    "ApiKey",
    "Base",
    "Checkpoint",
    "Evaluation",
    "File",
    "IdempotencyKey",
    "Job",
    "JobEvent",
    "JobMetric",
    "Team",
    "make_engine",
    "make_session_factory",
    "new_id",
    "session_scope",
    "utcnow",
]
