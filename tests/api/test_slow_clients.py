"""Slow and greedy clients cannot take the service from other teams (issue 14 #1, #5, #9, #11;
DESIGN.md §6): uploads have their own bounded concurrency and an idle timeout, /healthz waits
behind nothing, event streams are capped per team and in all.

Each test runs the app behind a real uvicorn on a loopback port (in a thread), because what is
tested is how requests share that server's event loop and thread pool; slow clients are raw
HTTP connections that send part of a body and then wait.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest
from prometheus_client import generate_latest
from sqlalchemy import func, select

from api.limits import stream_limiter, upload_limiter
from api.main import create_app
from models.tables import File
from tests.api.conftest import PREFERENCE, job_body, jsonl, stored_objects, upload
from tests.fixtures.live import serve_in_thread

POOL_TOKENS = 40  # anyio's default thread limiter: every sync route and dependency shares it
BOUNDARY = "slowclientboundary"


@pytest.fixture
def settings(settings):
    return settings.model_copy(
        update={
            "MAX_UPLOAD_BYTES": 8 << 20,
            "UPLOAD_MAX_CONCURRENT": 64,
            "UPLOAD_MAX_PER_TEAM": 60,
            "UPLOAD_IDLE_TIMEOUT_S": 30.0,
        }
    )


def make_app(settings, store, queue, db_sessions, **overrides):
    return create_app(
        settings.model_copy(update=overrides), store=store, queue=queue, session_factory=db_sessions
    )


serve = serve_in_thread  # the app behind uvicorn on a loopback port, in a thread: the port


def multipart(content: bytes, purpose: str = "train") -> tuple[bytes, bytes]:
    """The body of an upload, split into its head (up to the file's bytes) and its tail."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n{purpose}\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="d.jsonl"'
        "\r\nContent-Type: application/jsonl\r\n\r\n"
    ).encode()
    return head + content, f"\r\n--{BOUNDARY}--\r\n".encode()


class SlowUpload:
    """POST /v1/files that sends its headers and `sent` bytes of its body, then waits."""

    def __init__(self, port: int, key: str, content: bytes = PREFERENCE, sent: int | None = None):
        body, tail = multipart(content)
        self.body = body + tail
        self.sent = len(body) - 10 if sent is None else sent
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.conn.putrequest("POST", "/v1/files")
        self.conn.putheader("Authorization", f"Bearer {key}")
        self.conn.putheader("Content-Type", f"multipart/form-data; boundary={BOUNDARY}")
        self.conn.putheader("Content-Length", str(len(self.body)))
        self.conn.endheaders()
        if self.sent:
            self.conn.send(self.body[: self.sent])

    def finish(self) -> http.client.HTTPResponse:
        self.conn.send(self.body[self.sent :])
        return self.response()

    def response(self, timeout: float = 30) -> http.client.HTTPResponse:
        assert self.conn.sock is not None
        self.conn.sock.settimeout(timeout)
        r = self.conn.getresponse()
        r.read()
        return r

    def close(self) -> None:
        self.conn.close()


def wait_for(predicate, timeout: float = 10, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        time.sleep(0.02)


def timed_get(port: int, path: str, headers: dict | None = None, timeout: float = 5.0):
    start = time.perf_counter()
    r = httpx.get(f"http://127.0.0.1:{port}{path}", headers=headers, timeout=timeout)
    return r, time.perf_counter() - start


def file_rows(db_sessions) -> int:
    with db_sessions() as s:
        return s.execute(select(func.count()).select_from(File)).scalar_one()


# --- uploads ----------------------------------------------------------------------------------


def test_slow_uploads_never_hold_the_request_pool(app, team_a, team_b):
    """Regression (issue 14 #1): each upload held one of the request pool's 40 threads for as
    long as its client took to send it, so 40 slow uploads froze every other team's requests
    and the liveness probe. Now 50 slow uploads wait in the event loop: team B is served at
    once, and the uploads still complete."""
    n = POOL_TOKENS + 10
    with serve(app) as port:
        uploads = [SlowUpload(port, team_a.key) for _ in range(n)]
        try:
            wait_for(lambda: upload_limiter(app.state).in_use(team_a.id) == n, what="uploads")
            time.sleep(0.3)  # what would block would be blocked by now
            r, took = timed_get(port, "/v1/jobs", team_b.headers)
            assert r.status_code == 200 and took < 3, (r.status_code, took)
            r, took = timed_get(port, "/healthz")
            assert r.status_code == 200 and took < 1, (r.status_code, took)
            with ThreadPoolExecutor(8) as pool:
                codes = list(pool.map(lambda u: u.finish().status, uploads))
            assert codes == [201] * n
        finally:
            for u in uploads:
                u.close()
    assert upload_limiter(app.state).in_use() == 0


def test_healthz_answers_while_the_request_pool_is_saturated(app):
    """/healthz is answered in the event loop: with every thread of the request pool taken,
    /readyz (which needs one, and the database) waits, and /healthz does not."""
    release, inside = threading.Event(), threading.Semaphore(0)

    def hold_a_thread():
        inside.release()
        release.wait(30)
        return {}

    app.add_api_route("/test/hold-a-thread", hold_a_thread)
    with serve(app) as port, ThreadPoolExecutor(POOL_TOKENS + 5) as pool:
        try:
            held = [
                pool.submit(httpx.get, f"http://127.0.0.1:{port}/test/hold-a-thread", timeout=40)
                for _ in range(POOL_TOKENS + 5)
            ]
            for _ in range(POOL_TOKENS):
                assert inside.acquire(timeout=10)
            with pytest.raises(httpx.TimeoutException):  # the pool is saturated
                httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=0.5)
            for _ in range(5):
                r, took = timed_get(port, "/healthz", timeout=2)
                assert r.status_code == 200 and took < 0.5, took
        finally:
            release.set()
        assert all(f.result().status_code == 200 for f in held)


@pytest.mark.parametrize("sent", ["nothing", "part of a line", "more than a block"])
def test_an_idle_upload_is_408_and_leaves_nothing(
    settings, store, queue, db_sessions, team_a, sent
):
    """A client that stops sending is answered 408 after UPLOAD_IDLE_TIMEOUT_S, whether it
    sent nothing of its body, part of it, or enough that a temporary object was being
    written: no object, no temporary file, no row, and its slot is free again."""
    app = make_app(settings, store, queue, db_sessions, UPLOAD_IDLE_TIMEOUT_S=0.5)
    big = jsonl([{"prompt": f"Q{i} " + "x" * 200, "chosen": "a", "rejected": "b"}
                 for i in range(8000)])  # fmt: skip  # ~1.8 MB: the worker thread has started
    content, count = {
        "nothing": (PREFERENCE, 0),
        "part of a line": (PREFERENCE, None),
        "more than a block": (big, None),
    }[sent]
    with serve(app) as port:
        slow = SlowUpload(port, team_a.key, content, sent=count)
        try:
            start = time.monotonic()
            r = slow.response(timeout=10)
            waited = time.monotonic() - start
        finally:
            slow.close()
        assert r.status == 408, r.status
        assert r.getheader("connection") == "close"
        assert 0.4 < waited < 5, waited
        wait_for(lambda: upload_limiter(app.state).in_use() == 0, what="the slot")
    assert file_rows(db_sessions) == 0
    assert stored_objects(store) == []  # nor a temporary file under .tmp/


def test_an_idle_upload_error_says_why(settings, store, queue, db_sessions, team_a):
    app = make_app(settings, store, queue, db_sessions, UPLOAD_IDLE_TIMEOUT_S=0.3)
    with serve(app) as port:
        slow = SlowUpload(port, team_a.key)
        try:
            assert slow.conn.sock is not None
            slow.conn.sock.settimeout(10)
            r = slow.conn.getresponse()
            body = r.read().decode()
        finally:
            slow.close()
    assert r.status == 408 and "UPLOAD_IDLE_TIMEOUT_S" in body and "nothing" in body


def test_uploads_over_the_caps_are_429_or_503_with_retry_after(
    settings, store, queue, db_sessions, team_a, team_b
):
    app = make_app(
        settings, store, queue, db_sessions, UPLOAD_MAX_PER_TEAM=2, UPLOAD_MAX_CONCURRENT=3
    )
    with serve(app) as port:
        base = f"http://127.0.0.1:{port}"
        held = [SlowUpload(port, team_a.key), SlowUpload(port, team_a.key)]
        try:
            wait_for(lambda: upload_limiter(app.state).in_use() == 2)
            scraped = generate_latest(app.state.metrics.registry).decode()
            assert "humanline_uploads_in_progress 2.0" in scraped
            r = upload(httpx.Client(base_url=base, timeout=10), team_a)
            assert r.status_code == 429, r.text
            assert r.headers["retry-after"].isdigit()
            assert "UPLOAD_MAX_PER_TEAM=2" in r.json()["error"]["message"]
            held.append(SlowUpload(port, team_b.key))  # B's own slot: the team cap is per team
            wait_for(lambda: upload_limiter(app.state).in_use() == 3)
            r = upload(httpx.Client(base_url=base, timeout=10), team_b)
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"].isdigit()
            assert "UPLOAD_MAX_CONCURRENT=3" in r.json()["error"]["message"]
            assert [u.finish().status for u in held] == [201, 201, 201]
        finally:
            for u in held:
                u.close()
        assert upload_limiter(app.state).in_use() == 0
        r = upload(httpx.Client(base_url=base, timeout=10), team_a)
        assert r.status_code == 201, r.text
    assert file_rows(db_sessions) == 4  # nothing of the refused ones


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.parametrize("sent", ["part of a line", "more than a block"])
def test_a_client_leaving_mid_upload_is_not_a_500(settings, store, queue, db_sessions, team_a,
                                                  sent):  # fmt: skip
    """Regression (issue 14 #9): a client that disconnected mid-upload was logged as an
    unhandled error (500, with a stack trace). It is a client's doing: logged as 499 at
    info level, and it leaves nothing behind."""
    app = make_app(settings, store, queue, db_sessions)
    big = jsonl([{"prompt": f"Q{i} " + "x" * 200, "chosen": "a", "rejected": "b"}
                 for i in range(8000)])  # fmt: skip
    content = PREFERENCE if sent == "part of a line" else big
    handler, logger = Records(), logging.getLogger("humanline")

    def access_lines() -> list[logging.LogRecord]:
        return [r for r in handler.records if getattr(r, "route", None) == "/v1/files"]

    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with serve(app) as port:
            slow = SlowUpload(port, team_a.key, content)
            wait_for(lambda: upload_limiter(app.state).in_use() == 1)
            time.sleep(0.3)
            slow.close()
            wait_for(lambda: upload_limiter(app.state).in_use() == 0, what="the slot")
            wait_for(lambda: access_lines(), what="the upload's access log line")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    errors = [r for r in handler.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    assert [line.status for line in access_lines()] == [499]  # type: ignore[attr-defined]
    assert file_rows(db_sessions) == 0
    assert stored_objects(store) == []


# --- event streams ----------------------------------------------------------------------------


@contextmanager
def open_stream(port: int, key: str, job_id: str) -> Iterator[httpx.Response]:
    with httpx.Client(timeout=10) as http, http.stream(
        "GET", f"http://127.0.0.1:{port}/v1/jobs/{job_id}/events/stream",
        headers={"Authorization": f"Bearer {key}"},
    ) as r:  # fmt: skip
        lines = r.iter_lines()  # kept: a collected iterator would close the connection
        if r.status_code == 200:
            assert next(lines) == "retry: 3000"  # the stream has started
        else:
            r.read()
        yield r


def _queued_job(client, team) -> str:
    r = upload(client, team)
    assert r.status_code == 201, r.text
    r = client.post("/v1/jobs", headers=team.headers, json=job_body(r.json()["id"]))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_event_streams_are_capped_per_team_and_in_all(
    settings, store, queue, db_sessions, team_a, team_b
):
    """Regression (issue 14 #5): streams were unlimited, and 1,500 from one team timed out
    the others' requests. Over STREAMS_PER_TEAM a team gets 429, over STREAMS_TOTAL anyone
    gets 503, both with Retry-After; a slot is free again once its client disconnects."""
    from fastapi.testclient import TestClient

    app = make_app(settings, store, queue, db_sessions, STREAMS_PER_TEAM=2, STREAMS_TOTAL=3)
    client = TestClient(app)
    job_a, job_b = _queued_job(client, team_a), _queued_job(client, team_b)
    slots = stream_limiter(app.state)
    with serve(app) as port:
        with open_stream(port, team_a.key, job_a) as s1, open_stream(port, team_a.key, job_a):
            assert s1.status_code == 200
            with open_stream(port, team_a.key, job_a) as refused:
                assert refused.status_code == 429
                assert refused.headers["retry-after"].isdigit()
                message = refused.json()["error"]["message"]
                assert "STREAMS_PER_TEAM=2" in message and "event streams" in message
            with open_stream(port, team_b.key, job_a) as other:  # not B's job: 404, no slot
                assert other.status_code == 404
            assert slots.in_use(team_b.id) == 0
            with open_stream(port, team_b.key, job_b) as b1:
                assert b1.status_code == 200
                with open_stream(port, team_b.key, job_b) as refused:
                    assert refused.status_code == 503
                    assert refused.headers["retry-after"].isdigit()
                    assert "STREAMS_TOTAL=3" in refused.json()["error"]["message"]
                scraped = generate_latest(app.state.metrics.registry).decode()
                assert "humanline_event_streams_open 3.0" in scraped
                r, took = timed_get(port, "/v1/jobs", team_b.headers)  # others are served
                assert r.status_code == 200
        # every client has gone: their slots come back without waiting for a poll or event
        wait_for(lambda: slots.in_use() == 0, timeout=5, what="the stream slots")
        with open_stream(port, team_a.key, job_a) as again:
            assert again.status_code == 200
        wait_for(lambda: slots.in_use() == 0, timeout=5)


def test_a_finished_stream_frees_its_slot(client, app, team_a, train_file):
    r = client.post("/v1/jobs", headers=team_a.headers, json=job_body(train_file))
    job_id = r.json()["id"]
    client.post(f"/v1/jobs/{job_id}/cancel", headers=team_a.headers)  # terminal: it ends
    for _ in range(app.state.settings.STREAMS_PER_TEAM + 2):
        r = client.get(f"/v1/jobs/{job_id}/events/stream", headers=team_a.headers)
        assert r.status_code == 200 and "event: end" in r.text
    assert stream_limiter(app.state).in_use() == 0
