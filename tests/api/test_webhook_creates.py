"""Webhook creation never blocks the API (issue 37 #3): a slow name server answering team A's
lookups costs other teams nothing. The app runs behind a real uvicorn on a loopback port (what
is tested is how requests share its event loop, threads and database connections); the
resolver is simulated (models.webhook_urls.resolve patched: seconds per lookup)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest

from api.main import create_app
from models import webhook_urls, webhooks
from tests.fixtures.live import serve_in_thread


@pytest.fixture(autouse=True)
def _no_sender():
    previous = webhooks.set_sender(None)
    yield
    webhooks.set_sender(previous)


class SlowResolver:
    """Answers a public address after `delay` seconds; counts the lookups it was asked."""

    def __init__(self, delay: float):
        self.delay, self.calls, self._lock = delay, 0, threading.Lock()

    def __call__(self, host: str, port: int) -> list[str]:
        with self._lock:
            self.calls += 1
        time.sleep(self.delay)
        return ["93.184.215.14"]


@contextmanager
def _released(gate: threading.Event):
    try:
        yield
    finally:
        gate.set()  # no lookup thread is left waiting into the next test


def _app(settings, store, queue, db_sessions, **overrides):
    settings = settings.model_copy(
        update={"WEBHOOKS_ALLOWED_CIDRS": "127.0.0.1/32", "WEBHOOK_DNS_TIMEOUT_SECONDS": 1.0,
                **overrides}
    )  # fmt: skip
    return create_app(settings, store=store, queue=queue, session_factory=db_sessions)


HTTP = httpx.Client(timeout=30, limits=httpx.Limits(max_connections=100))  # one SSL context


def _create(port: int, team, url: str = "http://slow.example/hook") -> httpx.Response:
    return HTTP.post(
        f"http://127.0.0.1:{port}/v1/webhooks", headers=team.headers, json={"url": url}
    )


def test_slow_lookups_do_not_slow_other_teams(
    settings, store, queue, db_sessions, team_a, team_b, monkeypatch
):
    """45 creates of team A whose lookups take 8 s (the red team's case; the per-team bound
    lifted, so that only where the lookups wait is tested): team B's GET /v1/files stays fast,
    and each create is answered at the lookup timeout (1 s), not after the lookup."""
    gate = threading.Event()  # the name server answers after 8 s, or when the test ends
    resolver = SlowResolver(0.0)
    monkeypatch.setattr(webhook_urls, "resolve", lambda h, p: (gate.wait(8), resolver(h, p))[1])
    monkeypatch.setattr(webhook_urls, "MAX_LOOKUPS_PER_OWNER", 64)  # only where they wait
    app = _app(settings, store, queue, db_sessions, WEBHOOK_CREATES_PER_TEAM=64, WEBHOOK_CREATES=64)
    with serve_in_thread(app) as port, ThreadPoolExecutor(45) as pool, _released(gate):
        started = time.monotonic()
        creates = [pool.submit(_create, port, team_a) for _ in range(45)]
        time.sleep(0.3)  # the creates are in
        slowest = 0.0
        while not all(f.done() for f in creates):
            t0 = time.monotonic()
            r = HTTP.get(f"http://127.0.0.1:{port}/v1/files", headers=team_b.headers)
            assert r.status_code == 200, r.text
            slowest = max(slowest, time.monotonic() - t0)
            time.sleep(0.05)
        answered = time.monotonic() - started
        results = [f.result() for f in creates]
    assert slowest < 0.75, f"team B waited {slowest:.2f}s"
    assert answered < 5, f"the creates took {answered:.1f}s"
    assert {r.status_code for r in results} == {400}
    assert all("did not resolve within 1s" in r.json()["error"]["message"] for r in results)


def test_a_teams_creates_are_bounded_and_the_cap_comes_before_any_lookup(
    settings, store, queue, db_sessions, team_a, team_b, monkeypatch
):
    gate = threading.Event()
    resolver = SlowResolver(0.0)
    monkeypatch.setattr(webhook_urls, "resolve", lambda h, p: (gate.wait(10), resolver(h, p))[1])
    app = _app(
        settings, store, queue, db_sessions, WEBHOOK_CREATES_PER_TEAM=2,
        WEBHOOK_DNS_TIMEOUT_SECONDS=10.0,
    )  # fmt: skip
    with serve_in_thread(app) as port, ThreadPoolExecutor(10) as pool:
        creates = [pool.submit(_create, port, team_a) for _ in range(10)]
        deadline = time.monotonic() + 10
        while sum(f.done() for f in creates) < 8:  # two wait for their lookup, 8 are refused
            assert time.monotonic() < deadline, [f.done() for f in creates]
            time.sleep(0.02)
        gate.set()
        codes = sorted(f.result().status_code for f in creates)
        assert codes == [201] * 2 + [429] * 8, codes
        assert _create(port, team_b).status_code == 201  # another team is not counted
        for _ in range(18):  # team A at its cap of 20 endpoints
            assert _create(port, team_a, "http://127.0.0.1:9/hook").status_code == 201
        calls = resolver.calls
        r = _create(port, team_a)
        assert r.status_code == 429 and "at most 20 webhooks" in r.text
        assert resolver.calls == calls == 3  # refused without a lookup


def test_a_teams_abandoned_lookups_are_bounded(
    settings, store, queue, db_sessions, team_a, team_b, monkeypatch
):
    """A lookup past its timeout keeps its thread until the name server answers: team A,
    creating again and again, may leave MAX_LOOKUPS_PER_OWNER of them running, then gets 429
    without a lookup; the pool stays free for team B."""
    gate = threading.Event()
    resolver = SlowResolver(0.0)

    def resolve(host: str, port: int) -> list[str]:
        if host == "slow.example":
            gate.wait(30)
        return resolver(host, port)

    monkeypatch.setattr(webhook_urls, "resolve", resolve)
    app = _app(settings, store, queue, db_sessions, WEBHOOK_DNS_TIMEOUT_SECONDS=0.2)
    try:
        with serve_in_thread(app) as port:
            for _ in range(webhook_urls.MAX_LOOKUPS_PER_OWNER):
                r = _create(port, team_a)
                assert r.status_code == 400 and "did not resolve within" in r.text, r.text
            r = _create(port, team_a)
            assert r.status_code == 429 and "still waiting" in r.text, r.text
            assert resolver.calls == 0  # none of the slow ones answered; none more asked
            assert _create(port, team_b, "http://fast.example/hook").status_code == 201
    finally:
        gate.set()
