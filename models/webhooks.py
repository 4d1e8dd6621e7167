"""Webhooks: a team's endpoints, the transactional outbox of deliveries, the attempt log.

    record_job_event(session, job_id, "succeeded")     # in the transaction of the transition
    record_evaluation_event(session, evaluation_id, "failed")

write one `webhook_deliveries` row per (enabled endpoint subscribed to the event) in the same
transaction as the state change: the event is committed with it or not at all (no event lost
on a crash, none sent for a change that rolled back). After the commit, the ids of the
endpoints concerned go to the process's sender (set_sender: a Celery task, the embedded
worker's webhook thread); the workers' reaper sends again whatever stayed due
(worker.webhooks.due_endpoints), so a lost message only delays a delivery.

The delivery row's id is the `webhook-id` header: the same on every attempt of one event,
different for each event (Standard Webhooks). Deliveries of one endpoint go out in the order
of `seq` (one at a time: worker.webhooks holds a lease on the endpoint while it sends).
"""

from __future__ import annotations

import base64
import logging
import secrets
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal, get_args

from sqlalchemy import (
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    event,
    select,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from models.base import Base, new_id, utcnow
from models.tables import Evaluation, Job, _in

log = logging.getLogger("humanline.webhooks")

WebhookEvent = Literal[
    "job.succeeded", "job.failed", "job.cancelled", "evaluation.succeeded", "evaluation.failed"
]
WEBHOOK_EVENTS: tuple[str, ...] = get_args(WebhookEvent)
EndpointStatus = Literal["enabled", "disabled"]
ENDPOINT_STATUSES: tuple[str, ...] = get_args(EndpointStatus)
DeliveryStatus = Literal["pending", "delivered", "failed", "cancelled"]
DELIVERY_STATUSES: tuple[str, ...] = get_args(DeliveryStatus)
SECRET_PREFIX = "whsec_"
_PENDING_KEY = "humanline_webhook_endpoints"  # session.info: endpoints to wake after commit


class WebhookEndpoint(Base):
    """A team's receiver. `secret` signs every delivery; the API shows it once, at create."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (CheckConstraint(_in("status", ENDPOINT_STATUSES), name="status"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("wh"))
    team_id: Mapped[str] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(String(2048))
    description: Mapped[str | None] = mapped_column(String(200))
    events: Mapped[list[str]]
    secret: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(16), default="enabled")
    disabled_reason: Mapped[str | None] = mapped_column(Text)
    disabled_at: Mapped[datetime | None]
    # Deliveries whose every attempt failed, in a row; reset by a success.
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    # A delivering worker holds the endpoint until then (one sender at a time: ordered).
    lease_until: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    """One event for one endpoint: the outbox row, then its outcome."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        CheckConstraint(_in("status", DELIVERY_STATUSES), name="status"),
        Index("ix_webhook_deliveries_endpoint_status_seq", "endpoint_id", "status", "seq"),
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True, default=lambda: new_id("msg"))
    endpoint_id: Mapped[str] = mapped_column(
        ForeignKey("webhook_endpoints.id", ondelete="CASCADE")
    )
    team_id: Mapped[str] = mapped_column(String(40))
    event: Mapped[str] = mapped_column(String(40))
    payload: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]


class WebhookAttempt(Base):
    """The delivery log: one row per HTTP attempt (GET /v1/webhooks/{id}/deliveries)."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_seq: Mapped[int] = mapped_column(
        ForeignKey("webhook_deliveries.seq", ondelete="CASCADE"), index=True
    )
    attempt: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    duration_ms: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


def new_secret() -> str:
    """`whsec_` + base64 of 24 random bytes (the Standard Webhooks secret format)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode("ascii")


# --- the outbox -------------------------------------------------------------------------------


def record_event(
    session: Session, team_id: str, event_type: str, data: dict[str, Any]
) -> list[WebhookDelivery]:
    """Queue `event_type` for each of the team's enabled endpoints subscribed to it, in the
    caller's transaction. The endpoints are woken after the commit (see set_sender)."""
    if event_type not in WEBHOOK_EVENTS:
        raise ValueError(f"unknown webhook event {event_type!r}")
    endpoints = session.scalars(
        select(WebhookEndpoint).where(
            WebhookEndpoint.team_id == team_id, WebhookEndpoint.status == "enabled"
        )
    ).all()
    now = utcnow()
    payload = {"type": event_type, "timestamp": now.isoformat(), "data": data}
    rows = [
        WebhookDelivery(
            endpoint_id=endpoint.id, team_id=team_id, event=event_type, payload=payload,
            next_attempt_at=now,
        )
        for endpoint in endpoints
        if event_type in endpoint.events
    ]  # fmt: skip
    if rows:
        session.add_all(rows)
        session.flush()
        session.info.setdefault(_PENDING_KEY, set()).update(r.endpoint_id for r in rows)
    return rows


def record_job_event(session: Session, job_id: str, status: str) -> None:
    """The job reached the terminal `status` (called by models.jobs.transition)."""
    row = session.execute(
        select(Job.team_id, Job.error, Job.finished_at).where(Job.id == job_id)
    ).first()
    if row is None:
        return
    data: dict[str, Any] = {"id": job_id, "object": "job", "status": status}
    if status == "failed" and row.error:
        data["error"] = {"message": row.error.get("message"), "type": row.error.get("type")}
    record_event(session, row.team_id, f"job.{status}", data)


def record_evaluation_event(session: Session, evaluation_id: str, status: str) -> None:
    """The evaluation reached `status`; only succeeded and failed are webhook events."""
    if f"evaluation.{status}" not in WEBHOOK_EVENTS:
        return
    row = session.execute(
        select(Evaluation.team_id, Evaluation.job_id, Evaluation.error).where(
            Evaluation.id == evaluation_id
        )
    ).first()
    if row is None:
        return
    data: dict[str, Any] = {
        "id": evaluation_id, "object": "evaluation", "status": status, "job_id": row.job_id
    }
    if status == "failed" and row.error:
        data["error"] = {"message": row.error.get("message"), "type": row.error.get("type")}
    record_event(session, row.team_id, f"evaluation.{status}", data)


# --- waking the senders after the commit -------------------------------------------------------

_sender: Callable[[str], None] | None = None


def set_sender(send: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """Make `send(endpoint_id)` the process's way to start deliveries after a commit that
    queued some (None: rely on the reaper's sweep). Returns the previous sender."""
    global _sender
    previous, _sender = _sender, send
    return previous


@event.listens_for(Session, "after_commit")
def _wake_after_commit(session: Session) -> None:
    endpoints = session.info.pop(_PENDING_KEY, None)
    if not endpoints or _sender is None:
        return
    for endpoint_id in sorted(endpoints):
        try:
            _sender(endpoint_id)
        except Exception:  # noqa: BLE001 - the reaper sends it again; the commit stands
            log.exception("could not start the deliveries of webhook %s", endpoint_id)


@event.listens_for(Session, "after_rollback")
def _forget_after_rollback(session: Session) -> None:
    session.info.pop(_PENDING_KEY, None)
