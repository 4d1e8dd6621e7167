"""Database layer: ORM tables, engine/session helpers, the state machines, settings.

Imports SQLAlchemy and pydantic only (the API and the worker both use it; never torch).

    settings        Settings: the service's one settings class (environment variables)
    base, tables    the declarative base, ids, and the ORM tables (every user row has a team)
    db              engines and sessions from a URL (SQLite WAL, PostgreSQL pre-ping)
    leases          the one lease scheme of leased work: claim, renew/fence, release, reap
    launches        the lease of a multi-node job, held by one reconcile at a time
    jobs            the job state machine (guarded UPDATEs); job_events its gap-free events;
                    job_records metrics and checkpoints
    evaluations     the evaluation's life cycle, on the same leases
    quota           per-team quotas on active jobs and evaluations
    scheduling      fair claims across teams (fewest running, least recently served)
    teams           teams and API keys (only a key's sha256 is stored)
    webhooks        webhook endpoints, the outbox of deliveries and their attempt log;
                    webhook_urls the SSRF guard of their URLs
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
from models.webhooks import WebhookAttempt, WebhookDelivery, WebhookEndpoint

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
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
    "make_engine",
    "make_session_factory",
    "new_id",
    "session_scope",
    "utcnow",
]
