"""Webhook delivery cannot be stalled (issue 37 #1): an attempt ends at its deadline however
slowly its receiver drips bytes; endpoints are sent in parallel, a team's endpoints taking at
most WEBHOOK_SENDERS_PER_TEAM senders; the lease outlasts an attempt. Receivers on 127.0.0.1,
PostgreSQL, the embedded sender's thread pool (worker.webhook_thread)."""

from __future__ import annotations

import select as io_select
import socket
import threading
import time

import httpx
import pytest
from sqlalchemy import select

from models import webhooks
from models.base import utcnow
from models.webhooks import WebhookEndpoint, new_secret
from tests.worker.test_webhooks import deliveries, end_job, make_endpoint, make_team, settings_for
from tests.worker.webhook_receiver import Receiver
from worker.webhook_http import send_once
from worker.webhook_thread import WebhookThread
from worker.webhooks import lease_seconds


@pytest.fixture
def db_backend() -> str:
    return "postgresql"


@pytest.fixture(autouse=True)
def _no_sender():
    previous = webhooks.set_sender(None)
    yield
    webhooks.set_sender(previous)


class DripReceiver:
    """Reads the request, then answers one byte of a status line every `every` seconds, for
    as long as the sender listens: a per-read timeout of more than `every` never trips."""

    def __init__(self, every: float = 0.1):
        self.every, self.open_now, self.most_open, self.connections = every, 0, 0, 0
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._halt.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with self._lock:
            self.connections += 1
            self.open_now += 1
            self.most_open = max(self.most_open, self.open_now)
        try:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 100_000:
                if self._halt.is_set():
                    break
                conn.sendall(bytes([byte]))
                if io_select.select([conn], [], [], self.every)[0] and not conn.recv(1):
                    break  # the sender hung up (seen at once: counts stay exact)
        except OSError:
            pass  # the sender hung up: what the deadline does
        finally:
            with self._lock:
                self.open_now -= 1
            conn.close()

    def close(self) -> None:
        self._halt.set()
        self.sock.close()


@pytest.fixture
def drip():
    receiver = DripReceiver()
    yield receiver
    receiver.close()


def test_the_attempt_ends_at_its_deadline_not_per_read(db_url, drip):
    settings = settings_for(db_url, WEBHOOK_TIMEOUT_SECONDS=1.0)  # a byte every 0.1 s
    started = time.monotonic()
    with httpx.Client() as client:
        code, error = send_once(drip.url, new_secret(), "msg_1", {}, settings, client=client)
    took = time.monotonic() - started
    assert code is None and error is not None and "timed out" in error, error
    assert 0.9 < took < 1.6, took
    time.sleep(0.3)
    assert drip.open_now == 0  # the socket was closed, not left dripping


def test_a_dripping_receiver_delays_no_other_endpoint(db_sessions, db_url, drip):
    """Team A's receiver drips; team B's job.cancelled still arrives within its own attempt's
    time (it waited 99.8 s behind one thread before). The lease outlasts the dripping attempt:
    the endpoint is never taken by a second sender meanwhile."""
    settings = settings_for(
        db_url, WEBHOOK_TIMEOUT_SECONDS=1.0, WEBHOOK_BACKOFF_SECONDS=5.0, WEBHOOK_SENDERS=4
    )
    assert lease_seconds(settings) > 2 * settings.WEBHOOK_TIMEOUT_SECONDS
    team_a, team_b = make_team(db_sessions), make_team(db_sessions)
    slow, _ = make_endpoint(db_sessions, team_a, drip.url)
    sender = WebhookThread(db_sessions, settings, poll=60)
    sender.start()
    try:
        with Receiver() as rx:
            fast, _ = make_endpoint(db_sessions, team_b, rx.url)
            end_job(db_sessions, team_a, "failed")
            sender.wake(slow)
            deadline = time.monotonic() + 5
            while drip.connections == 0:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            with db_sessions() as s:  # mid-attempt: the lease runs well past its deadline
                lease_until = s.scalar(
                    select(WebhookEndpoint.lease_until).where(WebhookEndpoint.id == slow)
                )
            assert lease_until is not None
            assert (lease_until - utcnow()).total_seconds() > settings.WEBHOOK_TIMEOUT_SECONDS
            end_job(db_sessions, team_b, "cancelled")
            sent = time.monotonic()
            sender.wake(fast)
            while not rx.received:
                assert time.monotonic() - sent < settings.WEBHOOK_TIMEOUT_SECONDS, "delayed"
                time.sleep(0.01)
            assert rx.received[0].json["type"] == "job.cancelled"
        time.sleep(1.2)  # the dripping attempt has ended by its deadline, a failure
        [delivery] = deliveries(db_sessions, slow)
        assert delivery.attempts == 1 and "timed out" in (delivery.last_error or "")
        assert drip.connections == 1  # one sender, one attempt: never doubled
    finally:
        sender.stop()


def test_a_teams_endpoints_share_its_senders(db_sessions, db_url, drip):
    """Five dripping endpoints of one team hold at most WEBHOOK_SENDERS_PER_TEAM (2)
    connections at once; another team is sent at once meanwhile."""
    settings = settings_for(
        db_url, WEBHOOK_TIMEOUT_SECONDS=1.0, WEBHOOK_SENDERS=6, WEBHOOK_SENDERS_PER_TEAM=2,
        WEBHOOK_BACKOFF_SECONDS=30.0,
    )  # fmt: skip
    team_a, team_b = make_team(db_sessions), make_team(db_sessions)
    slow = [make_endpoint(db_sessions, team_a, drip.url)[0] for _ in range(5)]
    sender = WebhookThread(db_sessions, settings, poll=60)
    sender.start()
    try:
        with Receiver() as rx:
            fast, _ = make_endpoint(db_sessions, team_b, rx.url)
            end_job(db_sessions, team_a, "failed")
            for endpoint_id in slow:
                sender.wake(endpoint_id)
            time.sleep(0.3)
            end_job(db_sessions, team_b, "succeeded")
            sent = time.monotonic()
            sender.wake(fast)
            while not rx.received:
                assert time.monotonic() - sent < settings.WEBHOOK_TIMEOUT_SECONDS, "delayed"
                time.sleep(0.01)
            deadline = time.monotonic() + 8
            while drip.connections < 5:  # every endpoint gets its turn, two at a time
                assert time.monotonic() < deadline, drip.connections
                time.sleep(0.05)
        assert drip.most_open == 2
    finally:
        sender.stop()
