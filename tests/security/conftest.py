# ruff: noqa: F811  (the tests/api fixtures imported below are these fixtures' parameters)
"""The API test fixtures (tests/api/conftest.py), on PostgreSQL only: fuzzing both
backends would double the time for no new coverage of the API code. And what the security
tests share: secrets in the environment that must never leak (autouse), `world` (team A owns
one of everything, its data marked with MARKER), `every_route(world)` (each route that names a
team's object), `train_file_a`, and `live_server` (the app behind a real uvicorn)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from sqlalchemy import update

from models import jobs as job_states
from models.tables import Evaluation
from storage.keys import checkpoint_prefix, job_prefix, report_key
from tests.api.conftest import (  # noqa: F401 - fixtures
    EVAL_MATH,
    app,
    client,
    job_body,
    jsonl,
    queue,
    settings,
    store,
    team_a,
    team_b,
    upload,
)
from tests.fixtures.live import serve_in_thread

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
    model: str  # the job's fine-tuned model, OpenAI's id (it names team A)
    webhook: str = ""  # a webhook endpoint whose job.succeeded delivery is pending


@pytest.fixture(autouse=True)
def secrets_env(monkeypatch):
    monkeypatch.setenv("EVAL_JUDGE_API_KEY", JUDGE_SECRET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)


@pytest.fixture
def world(app, client, team_a, db_sessions, store, tmp_path) -> World:
    """Team A owns one of everything: files, a trained job with events, metrics, a
    checkpoint and an exported model, an evaluation with a stored report."""
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
    final = job_prefix(team_a.id, job) + "final/"
    store.upload_dir(final, ckpt)
    exported = {"prefix": final, "files": ["model.safetensors"]}
    with db_sessions() as s:
        assert job_states.claim(s, job, "w1", 60) is not None
        job_states.add_event(s, job, "started", f"training {MARKER}", {"total_steps": 4})
        for step in range(1, 5):
            job_states.record_metrics(s, job, step, {"loss": 0.5, "kl": 0.01})
        job_states.add_checkpoint(s, job, 4, prefix, bytes=180, files=["model.safetensors"])
        job_states.add_event(s, job, "finished", "finished 4 steps", {"step": 4})
        result = {"step": 4, "final_model": exported}
        assert job_states.finish(s, job, "w1", "succeeded", result=result)
        s.commit()
    r = client.post(
        "/v1/evaluations",
        headers=team_a.headers,
        json={"job_id": job, "step": 4, "file_id": eval_file, "kind": "math"},
    )
    assert r.status_code == 201, r.text
    evaluation = r.json()["id"]
    key = report_key(team_a.id, evaluation, f"{evaluation}.json")
    doc = {"kind": "math", "items": [{"index": 0, "problem": MARKER, "samples": []}]}
    store.put_bytes(key, json.dumps(doc).encode())
    with db_sessions() as s:
        s.execute(
            update(Evaluation)
            .where(Evaluation.id == evaluation)
            .values(status="succeeded", result={"metrics": {}, "report": {"json": key}})
        )
        s.commit()
    model = client.get(f"/v1/fine_tuning/jobs/{job}", headers=team_a.headers).json()
    webhook = client.post(  # after the job's end: nothing queued for it, the log is empty
        "/v1/webhooks", headers=team_a.headers,
        json={"url": "https://93.184.215.14/hook", "description": MARKER},
    ).json()["id"]  # fmt: skip
    return World(train, eval_file, job, evaluation, model["fine_tuned_model"], webhook)


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
        ("GET", f"/v1/jobs/{j}/model/download", {"file": "model.safetensors"}, None),
        ("GET", f"/v1/jobs/{j}/report", None, None),
        ("GET", f"/v1/jobs/{j}/report", {"format": "html"}, None),
        ("GET", f"/v1/evaluations/{e}", None, None),
        ("GET", f"/v1/evaluations/{e}/report", None, None),
        ("GET", f"/v1/evaluations/{e}/export", {"format": "lighteval"}, None),  # a math one
        ("GET", "/v1/reports/compare", {"jobs": j}, None),
        ("GET", "/v1/reports/compare", {"jobs": f"{j},{j}"}, None),
        ("GET", f"/v1/fine_tuning/jobs/{j}", None, None),
        ("POST", f"/v1/fine_tuning/jobs/{j}/cancel", None, None),
        ("GET", f"/v1/fine_tuning/jobs/{j}/events", None, None),
        ("GET", f"/v1/fine_tuning/jobs/{j}/checkpoints", None, None),
        ("GET", f"/v1/models/{w.model}", None, None),
        ("GET", f"/v1/webhooks/{w.webhook}", None, None),
        ("GET", f"/v1/webhooks/{w.webhook}/deliveries", None, None),
        ("DELETE", f"/v1/webhooks/{w.webhook}", None, None),
        (
            "POST",
            "/v1/fine_tuning/jobs",
            None,
            {"model": "tiny-llama", "training_file": w.train, "method": {"type": "dpo"}},
        ),
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


@pytest.fixture
def train_file_a(client, team_a) -> str:
    return upload(client, team_a).json()["id"]


@pytest.fixture
def db_backend() -> str:
    return "postgresql"


@pytest.fixture
def live_server(app, team_a):
    """The app behind a real uvicorn (h11) on a loopback port, in a thread: (base_url, key)."""
    with serve_in_thread(app) as port:
        yield f"http://127.0.0.1:{port}", team_a.key
