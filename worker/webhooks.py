"""Webhook delivery (docs/webhooks.md): the outbox rows of models.webhooks, sent in order per
endpoint, signed as Standard Webhooks do, retried with exponential backoff.

    delay = deliver_endpoint(sessions, settings, endpoint_id)  # the Celery task
                                                               # `deliver_webhooks` and the
                                                               # embedded WebhookThread call it
    if delay is not None: run it again in `delay` seconds       # the next retry is due then

One sender per endpoint at a time (a lease on the endpoint row, renewed before every attempt,
which ends by its deadline: worker.webhook_http), at most WEBHOOK_SENDERS_PER_TEAM senders per
team (counted at claim time, the team's endpoint rows locked), its oldest pending delivery
first: a delivery waiting for its retry holds the later ones back, so a receiver sees one job's
events in order. Before every attempt the endpoint must still exist and be enabled, its
team must still hold a live API key, and the URL's host must still resolve to an allowed
address (the connection goes to the address checked: DNS rebinding gains nothing). Each
attempt is a row of the delivery log; WEBHOOK_MAX_ATTEMPTS failed attempts fail the delivery,
WEBHOOK_DISABLE_AFTER failed deliveries in a row disable the endpoint (its `status` and
`disabled_reason` say so; its pending deliveries are cancelled).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from enum import Enum

import httpx
from sqlalchemy import exists, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from models.base import utcnow
from models.settings import Settings
from models.tables import ApiKey
from models.webhook_urls import Resolver, resolve
from models.webhooks import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from worker.webhook_http import USER_AGENT, send_once, sign, signed_headers

__all__ = ["USER_AGENT", "deliver_endpoint", "due_endpoints", "send_once", "sign",
           "signed_headers"]  # fmt: skip
log = logging.getLogger("humanline.worker.webhooks")
TEAM_BUSY_RETRY_SECONDS = 1.0  # the team has WEBHOOK_SENDERS_PER_TEAM senders: try again then


def lease_seconds(settings: Settings) -> float:
    """How long a sender holds its endpoint; renewed before every attempt, and an attempt
    ends by its deadline (WEBHOOK_TIMEOUT_SECONDS), so a live sender never loses it."""
    return 2 * settings.WEBHOOK_TIMEOUT_SECONDS + 30


def backoff(settings: Settings, attempts: int) -> float:
    """Seconds before the next attempt after `attempts` failed ones: doubling, capped."""
    base = settings.WEBHOOK_BACKOFF_SECONDS * 2 ** max(attempts - 1, 0)
    return float(min(base, settings.WEBHOOK_BACKOFF_MAX_SECONDS))


# --- the endpoint's queue ------------------------------------------------------------------------


class Claim(Enum):
    WON = "won"
    HELD = "held"  # another sender has the endpoint (or it is gone): it sends what we would
    TEAM_BUSY = "team_busy"  # the team's other endpoints hold its senders: retry soon


def _claim(session: Session, endpoint_id: str, seconds: float, per_team: int) -> Claim:
    """Take the endpoint's lease, if free and if its team has fewer than `per_team` leases
    (the team's endpoints are locked meanwhile: concurrent claims of one team count one by
    one)."""
    now = utcnow()
    team_id = session.scalar(
        select(WebhookEndpoint.team_id).where(WebhookEndpoint.id == endpoint_id)
    )
    if team_id is None:
        session.commit()
        return Claim.HELD
    # the team's endpoint rows, in one order (no deadlock), not the team's row: the scheduler's
    # claims and the inserts of the team's jobs and files never wait for a webhook sender
    session.execute(
        select(WebhookEndpoint.id)
        .where(WebhookEndpoint.team_id == team_id)
        .order_by(WebhookEndpoint.id)
        .with_for_update()
    ).all()
    busy = session.scalar(
        select(func.count())
        .select_from(WebhookEndpoint)
        .where(
            WebhookEndpoint.team_id == team_id,
            WebhookEndpoint.id != endpoint_id,
            WebhookEndpoint.lease_until >= now,
        )
    )
    if (busy or 0) >= per_team:
        session.commit()
        return Claim.TEAM_BUSY
    won = session.execute(
        update(WebhookEndpoint)
        .where(
            WebhookEndpoint.id == endpoint_id,
            or_(WebhookEndpoint.lease_until.is_(None), WebhookEndpoint.lease_until < now),
        )
        .values(lease_until=now + timedelta(seconds=seconds))
        .execution_options(synchronize_session=False)
    ).rowcount  # type: ignore[attr-defined]
    session.commit()
    return Claim.WON if won else Claim.HELD


def _release(session: Session, endpoint_id: str) -> None:
    session.execute(
        update(WebhookEndpoint)
        .where(WebhookEndpoint.id == endpoint_id)
        .values(lease_until=None)
        .execution_options(synchronize_session=False)
    )
    session.commit()


def _cancel_pending(session: Session, endpoint_id: str, reason: str) -> None:
    session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.endpoint_id == endpoint_id, WebhookDelivery.status == "pending")
        .values(status="cancelled", last_error=reason, finished_at=utcnow())
        .execution_options(synchronize_session=False)
    )


def _team_live(session: Session, team_id: str) -> bool:
    live = exists().where(ApiKey.team_id == team_id, ApiKey.revoked_at.is_(None))
    return bool(session.execute(select(live)).scalar())


def _head(session: Session, endpoint_id: str) -> WebhookDelivery | None:
    return session.scalars(
        select(WebhookDelivery)
        .where(WebhookDelivery.endpoint_id == endpoint_id, WebhookDelivery.status == "pending")
        .order_by(WebhookDelivery.seq)
        .limit(1)
    ).first()


def _record(
    session: Session, endpoint: WebhookEndpoint, delivery: WebhookDelivery, settings: Settings,
    code: int | None, error: str | None, duration_ms: int,
) -> None:  # fmt: skip
    now = utcnow()
    delivery.attempts += 1
    delivery.last_status_code, delivery.last_error = code, error
    session.add(WebhookAttempt(
        delivery_seq=delivery.seq, attempt=delivery.attempts, status_code=code, error=error,
        duration_ms=duration_ms, created_at=now,
    ))  # fmt: skip
    if error is None:
        delivery.status, delivery.finished_at = "delivered", now
        endpoint.consecutive_failures = 0
    elif delivery.attempts < settings.WEBHOOK_MAX_ATTEMPTS:
        delivery.next_attempt_at = now + timedelta(seconds=backoff(settings, delivery.attempts))
    else:
        delivery.status, delivery.finished_at = "failed", now
        endpoint.consecutive_failures += 1
        if endpoint.consecutive_failures >= settings.WEBHOOK_DISABLE_AFTER:
            endpoint.status, endpoint.disabled_at = "disabled", now
            endpoint.disabled_reason = (
                f"disabled after {endpoint.consecutive_failures} failed deliveries in a row "
                f"(last: {error})"
            )
            session.flush()
            _cancel_pending(session, endpoint.id, "endpoint disabled")
            log.warning("webhook %s disabled: %s", endpoint.id, endpoint.disabled_reason)
    session.commit()


def _drain(
    session: Session, endpoint_id: str, settings: Settings, client: httpx.Client,
    resolver: Resolver, lease: float,
) -> float | None:  # fmt: skip
    """Send due deliveries while holding the lease; the seconds until the next one, if any."""
    while True:
        endpoint = session.get(WebhookEndpoint, endpoint_id, populate_existing=True)
        if endpoint is None:  # deleted: its deliveries went with it
            return None
        if endpoint.status != "enabled":
            _cancel_pending(session, endpoint_id, "endpoint disabled")
            session.commit()
            return None
        if not _team_live(session, endpoint.team_id):
            _cancel_pending(session, endpoint_id, "the team's API keys are all revoked")
            session.commit()
            return None
        head = _head(session, endpoint_id)
        if head is None:
            session.commit()
            return None
        wait = (head.next_attempt_at - utcnow()).total_seconds()
        if wait > 0:
            session.commit()
            return wait
        url, secret, msg_id, payload = endpoint.url, endpoint.secret, head.id, head.payload
        team_id = endpoint.team_id
        session.commit()
        _claim_renew(session, endpoint_id, lease)  # commits: no transaction across the request
        started = time.monotonic()
        code, error = send_once(
            url, secret, msg_id, payload, settings, client=client, resolver=resolver,
            owner=team_id,
        )  # fmt: skip
        duration_ms = int((time.monotonic() - started) * 1000)
        endpoint = session.get(WebhookEndpoint, endpoint_id, populate_existing=True)
        head = session.get(WebhookDelivery, head.seq, populate_existing=True)
        if endpoint is None or head is None:
            session.rollback()
            return None
        _record(session, endpoint, head, settings, code, error, duration_ms)


def _claim_renew(session: Session, endpoint_id: str, seconds: float) -> None:
    session.execute(
        update(WebhookEndpoint)
        .where(WebhookEndpoint.id == endpoint_id)
        .values(lease_until=utcnow() + timedelta(seconds=seconds))
        .execution_options(synchronize_session=False)
    )
    session.commit()


def deliver_endpoint(
    sessions: sessionmaker[Session], settings: Settings, endpoint_id: str, *,
    client: httpx.Client | None = None, resolver: Resolver = resolve,
) -> float | None:  # fmt: skip
    """Send `endpoint_id`'s due deliveries, oldest first. Returns the seconds until its next
    retry is due (the caller runs this again then), or None when nothing is left pending or
    another process holds the endpoint (that one sends what this call would have)."""
    lease = lease_seconds(settings)
    own_client = client is None
    http = client or httpx.Client(follow_redirects=False, trust_env=False)
    try:
        with sessions() as session:
            delay: float | None = None
            while True:
                claim = _claim(session, endpoint_id, lease, settings.WEBHOOK_SENDERS_PER_TEAM)
                if claim is Claim.TEAM_BUSY:
                    return TEAM_BUSY_RETRY_SECONDS
                if claim is Claim.HELD:
                    break
                try:
                    delay = _drain(session, endpoint_id, settings, http, resolver, lease)
                finally:
                    session.rollback()
                    _release(session, endpoint_id)
                # A delivery committed while we held the lease found it taken and left it
                # to us: look once more after letting go.
                head = _head(session, endpoint_id)
                session.commit()
                if head is None or head.next_attempt_at > utcnow():
                    break
            return delay
    finally:
        if own_client:
            http.close()


def due_endpoints(sessions: sessionmaker[Session], limit: int = 100) -> list[str]:
    """Endpoints with a due pending delivery and no live sender: what the reaper sends again
    (a message lost between a commit and the broker, a worker that died mid-delivery)."""
    now = utcnow()
    with sessions() as session:
        rows = session.execute(
            select(WebhookDelivery.endpoint_id)
            .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
            .where(
                WebhookDelivery.status == "pending",
                WebhookDelivery.next_attempt_at <= now,
                WebhookEndpoint.status == "enabled",
                or_(WebhookEndpoint.lease_until.is_(None), WebhookEndpoint.lease_until < now),
            )
            .distinct()
            .limit(limit)
        ).scalars()
        return list(rows)
