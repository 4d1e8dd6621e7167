"""Team isolation on every route, path traversal, oversized input, and secrets/keys that must
never reach a response or a log line (DESIGN.md §6). PostgreSQL (tests/security/conftest.py).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import pytest
from sqlalchemy import update

from models import jobs as job_states
from models.tables import Evaluation
from storage.keys import checkpoint_prefix, report_key
from tests.api.conftest import EVAL_MATH, job_body, jsonl, stored_objects, upload

MARKER = "zebra-unicorn-7731"  # distinctive content of team A's data: must never leak
TRAIN = jsonl(
    [{"prompt": f"{MARKER} Q{i}?", "chosen": "good", "rejected": "bad"} for i in range(4)]
)
JUDGE_SECRET = "sk-judge-secret-9f8e7d"
AWS_SECRET = "aws-secret-4c3b2a1908"


class NullEvalQueue:
    def enqueue(self, evaluation_id: str) -> None:
        pass


@dataclass
class World:
    train: str
    eval_file: str
    job: str
    evaluation: str


@pytest.fixture(autouse=True)
def secrets_env(monkeypatch):
    monkeypatch.setenv("EVAL_JUDGE_API_KEY", JUDGE_SECRET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)


@pytest.fixture
def world(app, client, team_a, db_sessions, store, tmp_path) -> World:
    """Team A owns one of everything: files, a trained job with events, metrics and a
    checkpoint, an evaluation with a stored report."""
    app.state.eval_queue = NullEvalQueue()
    train = upload(client, team_a, TRAIN, filename=f"{MARKER}.jsonl").json()["id"]
    eval_file = upload(client, team_a, EVAL_MATH, purpose="eval").json()["id"]
    r = client.post(
        "/v1/jobs",
        headers=team_a.headers,
        json=job_body(train, metadata={"note": MARKER}),
    )
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(MARKER.encode() * 10)
    prefix = checkpoint_prefix(team_a.id, job, 4)
    store.upload_dir(prefix, ckpt)
    with db_sessions() as s:
        assert job_states.claim(s, job, "w1", 60) is not None
        job_states.add_event(s, job, "started", f"training {MARKER}", {"total_steps": 4})
        for step in range(1, 5):
            job_states.record_metrics(s, job, step, {"loss": 0.5, "kl": 0.01})
        job_states.add_checkpoint(s, job, 4, prefix, bytes=180, files=["model.safetensors"])
        job_states.add_event(s, job, "finished", "finished 4 steps", {"step": 4})
        assert job_states.finish(s, job, "w1", "succeeded", result={"step": 4})
        s.commit()
    r = client.post(
        "/v1/evaluations",
        headers=team_a.headers,
        json={"job_id": job, "step": 4, "file_id": eval_file, "kind": "math"},
    )
    assert r.status_code == 201, r.text
    evaluation = r.json()["id"]
    key = report_key(team_a.id, evaluation, f"{evaluation}.json")
    store.put_bytes(key, json.dumps({"items": [MARKER]}).encode())
    with db_sessions() as s:
        s.execute(
            update(Evaluation)
            .where(Evaluation.id == evaluation)
            .values(status="succeeded", result={"metrics": {}, "report": {"json": key}})
        )
        s.commit()
    return World(train, eval_file, job, evaluation)


def every_route(w: World) -> list[tuple[str, str, dict | None, dict | None]]:
    """(method, path, params, json) for every route that names a team's object."""
    j, e = w.job, w.evaluation
    return [
        ("GET", f"/v1/files/{w.train}", None, None),
        ("GET", f"/v1/files/{w.train}/content", None, None),
        ("DELETE", f"/v1/files/{w.train}", None, None),
        ("GET", f"/v1/jobs/{j}", None, None),
        ("POST", f"/v1/jobs/{j}/cancel", None, None),
        ("GET", f"/v1/jobs/{j}/events", None, None),
        ("GET", f"/v1/jobs/{j}/events/stream", None, None),
        ("GET", f"/v1/jobs/{j}/metrics", None, None),
        ("GET", f"/v1/jobs/{j}/checkpoints", None, None),
        ("GET", f"/v1/jobs/{j}/checkpoints/4/download", {"file": "model.safetensors"}, None),
        ("GET", f"/v1/jobs/{j}/report", None, None),
        ("GET", f"/v1/jobs/{j}/report", {"format": "html"}, None),
        ("GET", f"/v1/evaluations/{e}", None, None),
        ("GET", f"/v1/evaluations/{e}/report", None, None),
        ("GET", "/v1/reports/compare", {"jobs": j}, None),
        ("GET", "/v1/reports/compare", {"jobs": f"{j},{j}"}, None),
        ("POST", "/v1/jobs", None, job_body(w.train)),
        (
            "POST",
            "/v1/evaluations",
            None,
            {"job_id": j, "step": 4, "file_id": w.eval_file, "kind": "math"},
        ),
        (
            "POST",
            "/v1/evaluations",
            None,
            {"base_model": "tiny-llama", "file_id": w.eval_file, "kind": "math"},
        ),
    ]


def test_other_teams_get_404_on_every_route_and_no_data(client, team_a, team_b, world, store):
    objects_before = stored_objects(store)
    for method, path, params, body in every_route(world):
        r = client.request(method, path, headers=team_b.headers, params=params, json=body)
        assert r.status_code == 404, (method, path, r.status_code, r.text)
        assert r.json()["error"]["type"] == "not_found_error", r.text
        for secret in (MARKER, team_a.id, "model.safetensors", "step-4"):
            assert secret not in r.text, (method, path, secret, r.text)
    for path in ("/v1/files", "/v1/jobs", "/v1/evaluations"):
        r = client.get(path, headers=team_b.headers)
        assert r.status_code == 200 and r.json()["data"] == [], (path, r.text)
    # nothing of team A's was touched
    assert stored_objects(store) == objects_before
    assert client.get(f"/v1/jobs/{world.job}", headers=team_a.headers).json()["status"] == (
        "succeeded"
    )
    assert client.get(f"/v1/files/{world.train}", headers=team_a.headers).status_code == 200
    # and the owner does see all of it
    for method, path, params, body in every_route(world):
        if method == "GET" and "stream" not in path:
            r = client.get(path, headers=team_a.headers, params=params)
            assert r.status_code == 200, (path, r.text)


def test_every_route_needs_a_key(client, world):
    for method, path, params, body in every_route(world):
        r = client.request(method, path, params=params, json=body)
        assert r.status_code == 401, (method, path, r.text)
        assert MARKER not in r.text


# --- path traversal ---------------------------------------------------------------------------

HOSTILE_NAMES = [
    "../../../etc/passwd",
    "..\\..\\windows\\system32",
    "/etc/passwd",
    "a/../../b.jsonl",
    "%2e%2e%2f%2e%2e%2fx",
    "x\x00.jsonl",
    "team-other/file-1",
    "." * 300,
    "名前/../../秘密.jsonl",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_file_names_never_steer_object_keys(client, team_a, store, name):
    r = upload(client, team_a, filename=name)
    assert r.status_code in (201, 400, 422), r.text
    for key in stored_objects(store):
        assert key.startswith(f"{team_a.id}/"), key
        assert ".." not in key.split("/") and "\x00" not in key and "\\" not in key, key
    if r.status_code == 201:
        f = r.json()
        assert (
            "/" not in f["filename"] and "\\" not in f["filename"] and "\x00" not in f["filename"]
        )
        assert f["id"].startswith("file-")


def test_job_metadata_never_steers_object_keys(client, team_a, store, db_sessions, train_file_a):
    r = client.post(
        "/v1/jobs",
        headers=team_a.headers,
        json=job_body(
            train_file_a, metadata={"out": "../../../x", "team": "../team-b"}, suffix="../x"
        ),
    )
    assert r.status_code in (201, 422), r.text
    if r.status_code == 201:
        from models.tables import Job

        with db_sessions() as s:
            job = s.get(Job, r.json()["id"])
            assert ".." not in checkpoint_prefix(job.team_id, job.id, 1)
    for key in stored_objects(store):
        assert key.startswith(f"{team_a.id}/") and ".." not in key.split("/"), key


@pytest.fixture
def train_file_a(client, team_a) -> str:
    return upload(client, team_a).json()["id"]


@pytest.mark.parametrize(
    "name",
    [
        "../../../etc/passwd",
        "..%2f..%2fetc%2fpasswd",
        "%2e%2e/%2e%2e/model.safetensors",
        "model.safetensors/../../step-4/model.safetensors",
        "..\\model.safetensors",
        "model.safetensors\x00.png",
        "./model.safetensors",
        "//model.safetensors",
        "../step-4/model.safetensors",
        f"../../../{'x' * 200}",
    ],
)
def test_checkpoint_download_refuses_path_tricks(client, team_a, world, name):
    r = client.get(
        f"/v1/jobs/{world.job}/checkpoints/4/download",
        headers=team_a.headers,
        params={"file": name},
    )
    assert r.status_code in (404, 422), (name, r.text)
    assert MARKER not in r.text


def test_cross_team_object_keys_via_ids_are_404(client, team_a, team_b, world):
    """Ids that look like keys or traversals are just unknown ids."""
    for fake in (f"{team_a.id}/{world.job}", f"../{world.job}", f"{world.job}/../{world.job}"):
        r = client.get(f"/v1/jobs/{fake}", headers=team_b.headers)
        assert r.status_code == 404, (fake, r.text)
        assert MARKER not in r.text


# --- oversized input --------------------------------------------------------------------------


def test_oversized_bodies_are_413(client, team_a, settings, store):
    big = b'{"prompt": "x", "chosen": "a", "rejected": "b"}\n' * (settings.MAX_UPLOAD_BYTES // 40)
    r = upload(client, team_a, big)
    assert r.status_code == 413, r.status_code
    assert stored_objects(store) == []
    r = client.post(
        "/v1/jobs",
        headers={**team_a.headers, "Content-Type": "application/json"},
        content=b'{"base_model": "' + b"x" * (8 << 20) + b'"}',
    )
    assert r.status_code == 413, r.status_code
    line = (
        b'{"prompt": "' + b"x" * settings.MAX_LINE_BYTES + b'", "chosen": "a", "rejected": "b"}\n'
    )
    r = upload(client, team_a, line)
    assert r.status_code == 422 and "longer than" in r.text


def test_oversized_headers_are_4xx_on_a_real_server(live_server):
    import httpx

    base, key = live_server
    with httpx.Client(base_url=base, timeout=10) as http:
        r = http.get("/v1/jobs", headers={"Authorization": f"Bearer {key}", "X-Big": "x" * 70000})
        assert 400 <= r.status_code < 500, r.status_code
        r = http.get("/v1/jobs", headers={"Authorization": "Bearer " + "x" * 70000})
        assert 400 <= r.status_code < 500, r.status_code
        many = {f"X-H{i}": "y" * 100 for i in range(1000)}
        r = http.get("/v1/jobs", headers={"Authorization": f"Bearer {key}", **many})
        assert 400 <= r.status_code < 500, r.status_code
        assert http.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}).status_code == 200


# --- keys and secrets -------------------------------------------------------------------------


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage() + " " + json.dumps(record.__dict__, default=str))


def test_api_keys_and_secrets_never_logged_nor_returned(client, app, team_a, team_b, world, capsys):
    handler = Collect()
    loggers = [logging.getLogger(), logging.getLogger("humanline"), logging.getLogger("uvicorn")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    responses = []
    try:
        wrong = team_a.key[:-4] + "AAAA"
        for headers in (team_a.headers, team_b.headers, {"Authorization": f"Bearer {wrong}"}):
            for method, path, params, body in every_route(world):
                if "stream" in path:
                    continue
                responses.append(
                    client.request(method, path, headers=headers, params=params, json=body)
                )
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/v1/nowhere"):
            responses.append(client.get(path, headers=team_a.headers))
        responses.append(client.post("/v1/jobs", headers=team_a.headers, content=b"{not json"))
    finally:
        for lg, level in zip(loggers, levels):
            lg.removeHandler(handler)
            lg.setLevel(level)
    logged = "\n".join(handler.lines) + capsys.readouterr().out + capsys.readouterr().err
    assert len(handler.lines) > 0
    for secret in (team_a.key, team_b.key, wrong, team_a.key.split("_", 1)[-1]):
        assert secret not in logged, "an API key reached the logs"
    for r in responses:
        text = r.text + json.dumps(dict(r.headers))
        for secret in (team_a.key, team_b.key, wrong, JUDGE_SECRET, AWS_SECRET):
            assert secret not in text, (r.request.url, secret)
    assert JUDGE_SECRET not in logged and AWS_SECRET not in logged


# --- brute force ------------------------------------------------------------------------------


def test_failed_auth_is_rate_limited_per_client(client, app, team_a):
    from api.ratelimit import AuthFailureLimiter

    now = [1000.0]
    app.state.auth_limiter = AuthFailureLimiter(per_minute=20, clock=lambda: now[0])
    codes = [
        client.get("/v1/jobs", headers={"Authorization": f"Bearer hl_guess{i}"}).status_code
        for i in range(25)
    ]
    assert codes[:20] == [401] * 20 and codes[20:] == [429] * 5, codes
    r = client.get("/v1/jobs", headers={"Authorization": "Bearer hl_guess"})
    assert r.status_code == 429 and 1 <= int(r.headers["Retry-After"]) <= 3
    assert r.json()["error"]["type"]
    # even the right key is refused while blocked: a guess cannot be confirmed
    assert client.get("/v1/jobs", headers=team_a.headers).status_code == 429
    now[0] += 3.1  # one token back (20/min)
    assert client.get("/v1/jobs", headers=team_a.headers).status_code == 200
    assert client.get("/v1/jobs", headers={"Authorization": "Bearer x"}).status_code == 401
    assert client.get("/v1/jobs", headers={"Authorization": "Bearer x"}).status_code == 429
    # successes take no tokens; another client has its own bucket
    other = app.state.auth_limiter
    assert other.retry_after("10.0.0.9") is None
    now[0] += 120
    for _ in range(50):
        assert client.get("/v1/jobs", headers=team_a.headers).status_code == 200


def test_limiter_memory_is_bounded():
    from api.ratelimit import AuthFailureLimiter

    limiter = AuthFailureLimiter(per_minute=1, max_clients=100)
    for i in range(1000):
        limiter.failure(f"10.0.{i // 256}.{i % 256}")
    assert len(limiter._buckets) == 100
    assert limiter.retry_after("10.0.3.231") is not None  # the newest are remembered


def test_oversized_headers_are_431_in_process(client, team_a):
    """Regression: uvicorn's default parser (httptools) accepted 70 KB of headers; the app
    now refuses more than MAX_HEADER_BYTES itself, whatever the server."""
    from api.observability import MAX_HEADER_BYTES

    r = client.get("/v1/jobs", headers={**team_a.headers, "X-Big": "x" * MAX_HEADER_BYTES})
    assert r.status_code == 431 and r.json()["error"]["type"] == "invalid_request_error"
    assert client.get("/v1/jobs", headers={**team_a.headers, "X-Ok": "x" * 4000}).status_code == 200
