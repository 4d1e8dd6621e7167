"""Webhook delivery (docs/webhooks.md): the outbox rows of models.webhooks, sent in order per
endpoint, signed as Standard Webhooks do, retried with exponential backoff.

    delay = deliver_endpoint(sessions, settings, endpoint_id)  # the Celery task
                                                               # `deliver_webhooks` and the
                                                               # embedded WebhookThread call it
    if delay is not None: run it again in `delay` seconds       # the next retry is due then

One sender per endpoint at a time (a lease on the endpoint row), its oldest pending delivery
first: a delivery waiting for its retry holds the later ones back, so a receiver sees one
job's events in order. Before every attempt the endpoint must still exist and be enabled, its
team must still hold a live API key, and the URL's host must still resolve to an allowed
address (the connection goes to the address checked: DNS rebinding gains nothing). Each
attempt is a row of the delivery log; WEBHOOK_MAX_ATTEMPTS failed attempts fail the delivery,
WEBHOOK_DISABLE_AFTER failed deliveries in a row disable the endpoint (its `status` and
`disabled_reason` say so; its pending deliveries are cancelled).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import queue
import threading
import time
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

import httpx
from sqlalchemy import exists, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from models.base import utcnow
from models.settings import Settings
from models.tables import ApiKey
from models.webhook_urls import Resolver, Target, UrlRefused, check_url, resolve
from models.webhooks import SECRET_PREFIX, WebhookAttempt, WebhookDelivery, WebhookEndpoint

log = logging.getLogger("humanline.worker.webhooks")
USER_AGENT = "humanline-webhooks/1"


# --- signing (https://www.standardwebhooks.com) -----------------------------------------------


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, keyed by the secret's bytes."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def signed_headers(secret: str, msg_id: str, body: bytes, timestamp: int | None = None) -> dict:
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }


def backoff(settings: Settings, attempts: int) -> float:
    """Seconds before the next attempt after `attempts` failed ones: doubling, capped."""
    base = settings.WEBHOOK_BACKOFF_SECONDS * 2 ** max(attempts - 1, 0)
    return float(min(base, settings.WEBHOOK_BACKOFF_MAX_SECONDS))


# --- one attempt ---------------------------------------------------------------------------------


def _pinned(url: str, target: Target) -> tuple[str, dict[str, str], dict[str, str]]:
    """(URL with the checked address as host, Host header, httpx extensions for TLS SNI)."""
    parts = urlsplit(url)
    ip = target.addresses[0]
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    pinned = urlunsplit((parts.scheme, f"{host}:{target.port}", parts.path or "/", parts.query, ""))
    netloc = parts.netloc.rsplit("@", 1)[-1]
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    return pinned, {"host": netloc}, extensions


def send_once(
    url: str, secret: str, msg_id: str, payload: dict, settings: Settings, *,
    client: httpx.Client, resolver: Resolver = resolve,
) -> tuple[int | None, str | None]:  # fmt: skip
    """POST one delivery: (status code or None, error or None). 2xx is success."""
    try:
        target = check_url(url, settings, resolver=resolver)
    except UrlRefused as exc:
        return None, f"url refused at delivery: {exc}"
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    pinned, host, extensions = _pinned(url, target)
    headers = {**signed_headers(secret, msg_id, body), **host}
    try:
        with client.stream(
            "POST", pinned, content=body, headers=headers, extensions=extensions,
            timeout=settings.WEBHOOK_TIMEOUT_SECONDS,
        ) as response:  # fmt: skip
            code = response.status_code  # the body is never read
    except httpx.TimeoutException:
        return None, f"timed out after {settings.WEBHOOK_TIMEOUT_SECONDS:g}s"
    except Exception as exc:  # noqa: BLE001 - any failure is a failed attempt, logged
        return None, f"{type(exc).__name__}: {exc}"[:500]
    return code, None if 200 <= code < 300 else f"HTTP {code}"


# --- the endpoint's queue ------------------------------------------------------------------------


def _claim(session: Session, endpoint_id: str, seconds: float) -> bool:
    now = utcnow()
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
    return bool(won)


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
        session.commit()  # no transaction stays open across the HTTP request
        started = time.monotonic()
        code, error = send_once(
            url, secret, msg_id, payload, settings, client=client, resolver=resolver
        )
        duration_ms = int((time.monotonic() - started) * 1000)
        endpoint = session.get(WebhookEndpoint, endpoint_id, populate_existing=True)
        head = session.get(WebhookDelivery, head.seq, populate_existing=True)
        if endpoint is None or head is None:
            session.rollback()
            return None
        _record(session, endpoint, head, settings, code, error, duration_ms)
        _claim_renew(session, endpoint_id, lease)


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
    lease = 4 * settings.WEBHOOK_TIMEOUT_SECONDS + 30  # connect, write, read: each timed
    own_client = client is None
    http = client or httpx.Client(follow_redirects=False, trust_env=False)
    try:
        with sessions() as session:
            delay: float | None = None
            while _claim(session, endpoint_id, lease):
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


# --- the embedded worker's sender ----------------------------------------------------------------


class WebhookThread(threading.Thread):
    """Deliveries in a thread of their own (never behind a training job): woken by
    `wake(endpoint_id)` after a commit, by the retries it schedules, and every `poll` seconds
    for whatever is due (the reaper's role in the embedded server)."""

    def __init__(self, sessions: sessionmaker[Session], settings: Settings, poll: float = 5.0):
        super().__init__(name="humanline-webhooks", daemon=True)
        self.sessions, self.settings, self.poll = sessions, settings, poll
        self._wakeups: queue.Queue[str | None] = queue.Queue()
        self._retries: dict[str, float] = {}  # endpoint → monotonic time its retry is due
        self._halt = threading.Event()

    def wake(self, endpoint_id: str) -> None:
        self._wakeups.put(endpoint_id)

    def _due(self) -> set[str]:
        now = time.monotonic()
        due = {e for e, at in self._retries.items() if at <= now}
        for endpoint_id in due:
            del self._retries[endpoint_id]
        return due

    def run(self) -> None:
        last_poll = 0.0
        while not self._halt.is_set():
            timeout = min([self.poll, *(at - time.monotonic() for at in self._retries.values())])
            try:
                first = self._wakeups.get(timeout=max(timeout, 0.01))
                todo = {first} if first else set()
            except queue.Empty:
                todo = set()
            todo |= self._due()
            if time.monotonic() - last_poll >= self.poll:
                last_poll = time.monotonic()
                try:
                    todo |= set(due_endpoints(self.sessions))
                except Exception:
                    log.exception("webhook poll failed")
            for endpoint_id in sorted(todo):
                try:
                    delay = deliver_endpoint(self.sessions, self.settings, endpoint_id)
                except Exception:
                    log.exception("webhook %s: delivery failed", endpoint_id)
                    delay = self.poll
                if delay is not None:
                    self._retries[endpoint_id] = time.monotonic() + delay

    def stop(self, timeout: float = 10.0) -> None:
        self._halt.set()
        self._wakeups.put(None)
        self.join(timeout)
