"""Auth, error shape, request ids, health, metrics, and the no-torch rule."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import time

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.observability import JsonFormatter
from models.tables import ApiKey
from models.teams import revoke_api_key
from tests.api.conftest import upload


def _assert_error(r, status: int, type_: str | None = None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] and err["request_id"] == r.headers["x-request-id"]
    if type_:
        assert err["type"] == type_
    return err


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "hl_nothing"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer hl_not-a-real-key"},
        {"Authorization": "Bearer sk-something"},
    ],
)
def test_requests_without_a_valid_key_are_401(client, team_a, headers):
    for method, path in [
        ("GET", "/v1/files"),
        ("GET", "/v1/jobs"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs/job-x/events"),
    ]:
        r = client.request(method, path, headers=headers)
        _assert_error(r, 401, "authentication_error")
        assert r.headers["www-authenticate"] == "Bearer"


def _revoke_all(db_sessions, team_id: str) -> None:
    with db_sessions() as s:
        for key in s.query(ApiKey).filter_by(team_id=team_id).all():
            revoke_api_key(s, key.id)
        s.commit()


def test_revoked_key_is_401_at_once_without_key_cache(settings, store, queue, db_sessions, team_a):
    app = create_app(
        settings.model_copy(update={"AUTH_CACHE_SECONDS": 0}),
        store=store,
        queue=queue,
        session_factory=db_sessions,
    )
    client = TestClient(app)
    assert client.get("/v1/files", headers=team_a.headers).status_code == 200
    _revoke_all(db_sessions, team_a.id)
    _assert_error(client.get("/v1/files", headers=team_a.headers), 401)


def test_revoked_key_is_401_once_its_cache_entry_expires(
    settings, store, queue, db_sessions, team_a
):
    """The documented trade-off of AUTH_CACHE_SECONDS: a verified key is trusted that long."""
    ttl = 0.5
    app = create_app(
        settings.model_copy(update={"AUTH_CACHE_SECONDS": ttl}),
        store=store,
        queue=queue,
        session_factory=db_sessions,
    )
    client = TestClient(app)
    verified = time.monotonic()
    assert client.get("/v1/files", headers=team_a.headers).status_code == 200
    _revoke_all(db_sessions, team_a.id)
    # still inside the window (a slow machine may not be)
    if time.monotonic() - verified < ttl * 0.8:
        assert client.get("/v1/files", headers=team_a.headers).status_code == 200
    time.sleep(max(0.0, verified + ttl - time.monotonic()) + 0.05)
    _assert_error(client.get("/v1/files", headers=team_a.headers), 401)
    # an unknown key is never remembered: every guess is looked up (and rate-limited)
    assert app.state.key_cache._entries == {}


def test_request_id_is_echoed_or_made(client, team_a):
    r = client.get("/v1/files", headers={**team_a.headers, "X-Request-ID": "req-123"})
    assert r.headers["x-request-id"] == "req-123"
    made = client.get("/v1/files", headers={**team_a.headers, "X-Request-ID": "bad id <script>"})
    assert made.headers["x-request-id"] != "bad id" and len(made.headers["x-request-id"]) == 32
    err = client.get("/v1/files/file-nope", headers={**team_a.headers, "X-Request-ID": "r-9"})
    assert _assert_error(err, 404, "not_found_error")["request_id"] == "r-9"


def test_unknown_routes_and_methods_use_the_error_shape(client, team_a):
    _assert_error(client.get("/v1/nothing", headers=team_a.headers), 404)
    _assert_error(client.put("/v1/files", headers=team_a.headers), 405)


def test_query_validation_errors_name_the_field(client, team_a):
    err = _assert_error(client.get("/v1/jobs?limit=0", headers=team_a.headers), 422)
    assert err["field"] == "limit"
    err = _assert_error(client.get("/v1/jobs?status=bogus", headers=team_a.headers), 422)
    assert err["field"] == "status"


def _assert_metrics(text: str) -> None:
    assert 'humanline_http_requests_total{method="GET",route="/v1/files",status="200"}' in text
    assert 'route="/v1/files/{file_id}",status="404"' in text
    assert "humanline_http_request_duration_seconds_bucket" in text
    assert 'humanline_jobs{status="queued"} 0.0' in text
    assert "humanline_uploads_in_progress 0.0" in text
    assert "humanline_event_streams_open 0.0" in text


def test_health_and_ready(client):
    assert client.get("/healthz").json()["status"] == "ok"
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["database"] == "ok"


def test_metrics_are_not_on_the_api_port_by_default(client, team_a):
    """Issue 14 #11: /metrics was unauthenticated on the teams' port."""
    client.get("/v1/files", headers=team_a.headers)
    assert client.get("/metrics").status_code == 404
    assert client.get("/metrics", headers=team_a.headers).status_code == 404
    assert "/metrics" not in client.get("/openapi.json").json()["paths"]


def test_metrics_on_the_api_port_when_the_operator_says_so(settings, store, queue, db_sessions,
                                                          team_a):  # fmt: skip
    from fastapi.testclient import TestClient

    from api.main import create_app

    on = settings.model_copy(update={"METRICS_ON_API_PORT": True})
    client = TestClient(create_app(on, store=store, queue=queue, session_factory=db_sessions))
    client.get("/v1/files", headers=team_a.headers)
    client.get("/v1/files/file-123", headers=team_a.headers)
    _assert_metrics(client.get("/metrics").text)


def test_metrics_on_their_own_port(settings, store, queue, db_sessions, team_a):
    import httpx
    from fastapi.testclient import TestClient

    from api.main import create_app, serve_metrics
    from tests.fixtures.live import free_port

    port = free_port()
    own = settings.model_copy(update={"METRICS_PORT": port})
    app = create_app(own, store=store, queue=queue, session_factory=db_sessions)
    client = TestClient(app)
    server = serve_metrics(app)
    assert server is not None
    try:
        client.get("/v1/files", headers=team_a.headers)
        client.get("/v1/files/file-123", headers=team_a.headers)
        assert client.get("/metrics").status_code == 404  # not on the API's port
        r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert r.status_code == 200
        _assert_metrics(r.text)
        assert serve_metrics(app) is None  # the port is taken: logged, not fatal
    finally:
        server.shutdown()
        server.server_close()
    assert serve_metrics(create_app(settings, store=store, queue=queue,
                                    session_factory=db_sessions)) is None  # fmt: skip


def test_readyz_is_503_without_a_database(settings, store, queue):
    from fastapi.testclient import TestClient

    from api.main import create_app

    def failing():
        raise RuntimeError("database down")

    app = create_app(settings, store=store, queue=queue, session_factory=failing)
    r = TestClient(app).get("/readyz")
    assert r.status_code == 503 and r.json()["status"] == "unavailable"


def test_openapi_documents_the_routes(client):
    spec = client.get("/openapi.json").json()
    for path in [
        "/v1/files",
        "/v1/files/{file_id}",
        "/v1/files/{file_id}/content",
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/cancel",
        "/v1/jobs/{job_id}/events",
        "/v1/jobs/{job_id}/events/stream",
        "/v1/jobs/{job_id}/metrics",
        "/v1/jobs/{job_id}/checkpoints",
        "/v1/jobs/{job_id}/checkpoints/{step}/download",
        "/healthz",
        "/readyz",
    ]:
        assert path in spec["paths"], path


def test_logs_are_json_with_request_id_and_never_the_key(client, team_a):
    logger = logging.getLogger("humanline")
    logger.setLevel("INFO")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    try:
        client.get("/v1/files", headers={**team_a.headers, "X-Request-ID": "log-check"})
        upload(client, team_a, headers={"X-Request-ID": "log-check"})
    finally:
        logger.removeHandler(handler)
    err = out.getvalue()
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    access = [line for line in lines if line.get("request_id") == "log-check"]
    assert access and access[0]["status"] == 200 and access[0]["team_id"] == team_a.id
    assert team_a.key not in err and team_a.key[3:] not in err


def test_importing_the_api_does_not_import_torch():
    code = (
        "import sys, api.main, api.cli, api.routes.jobs, api.routes.files; "
        "bad = [m for m in ('torch', 'transformers', 'worker') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _asgi_post(app, path: str, chunks: list[bytes], headers: list[tuple[bytes, bytes]]):
    """POST with a chunked body and no Content-Length (TestClient always sends one)."""
    import asyncio

    sent: list[dict] = []
    pending = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]

    async def receive():
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body)


def test_bodies_without_content_length_are_cut_off_at_the_limit(app, team_a):
    auth = (b"authorization", f"Bearer {team_a.key}".encode())
    json_type = (b"content-type", b"application/json")
    status, body = _asgi_post(app, "/v1/jobs", [b"x" * 600_000] * 3, [auth, json_type])
    assert status == 413 and body["error"]["type"] == "request_too_large"
    boundary = b"hlboundary"
    head = (
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="purpose"\r\n\r\ntrain\r\n'
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; '
        b'filename="a.jsonl"\r\nContent-Type: application/jsonl\r\n\r\n'
    )
    chunks = [head] + [b"y" * 50_000] * 4  # 200 kB > MAX_UPLOAD_BYTES + multipart slack
    form = (b"content-type", b"multipart/form-data; boundary=" + boundary)
    status, body = _asgi_post(app, "/v1/files", chunks, [auth, form])
    assert status == 413 and body["error"]["request_id"]
