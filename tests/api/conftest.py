"""An app per test on a fresh database (SQLite and PostgreSQL), a local object store and a
queue that records what the API enqueued."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.main import create_app
from models import jobs as job_states
from models.settings import Settings
from models.tables import Job
from models.teams import create_api_key, create_team
from storage import open_store


@dataclass
class RecordingQueue:
    """Captures enqueue calls, and checks the job row is committed by then."""

    sessions: object
    job_ids: list[str] = field(default_factory=list)
    seen_status: dict[str, str] = field(default_factory=dict)

    def enqueue(self, job_id: str) -> None:
        with self.sessions() as s:  # a different session: sees committed rows only
            self.seen_status[job_id] = s.execute(
                select(Job.status).where(Job.id == job_id)
            ).scalar_one()
        self.job_ids.append(job_id)


@dataclass
class TeamClient:
    id: str
    key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@pytest.fixture
def settings(db_url, tmp_path) -> Settings:
    return Settings(
        DATABASE_URL=db_url,
        STORAGE_URL=f"file://{tmp_path / 'objects'}",
        BROKER_URL="memory://",
        MAX_UPLOAD_BYTES=64 * 1024,
        MAX_LINE_BYTES=4096,
        MAX_JOBS_PER_TEAM=5,
        UPLOAD_MAX_PER_TEAM=32,  # tests/faults races 20 uploads of one team
        SSE_POLL_SECONDS=0.02,
        LOG_LEVEL="WARNING",
    )


@pytest.fixture
def store(tmp_path):
    return open_store(f"file://{tmp_path / 'objects'}")


@pytest.fixture
def queue(db_sessions) -> RecordingQueue:
    return RecordingQueue(db_sessions)


@pytest.fixture
def app(settings, store, queue, db_sessions):
    return create_app(settings, store=store, queue=queue, session_factory=db_sessions)


@pytest.fixture
def client(app) -> TestClient:
    return TestClient(app)


def _team(db_sessions, name: str) -> TeamClient:
    with db_sessions() as s:
        team = create_team(s, name)
        _, secret = create_api_key(s, team.id)
        s.commit()
        return TeamClient(team.id, secret)


@pytest.fixture
def team_a(db_sessions) -> TeamClient:
    return _team(db_sessions, "team-a")


@pytest.fixture
def team_b(db_sessions) -> TeamClient:
    return _team(db_sessions, "team-b")


def jsonl(rows: list[dict]) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


PREFERENCE = jsonl([{"prompt": f"Q{i}?", "chosen": "good", "rejected": "bad"} for i in range(4)])
UNPAIRED = jsonl([{"prompt": f"Q{i}?", "completion": "A", "label": i % 2 == 0} for i in range(4)])
EVAL_MATH = jsonl([{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": 4}])


def upload(
    client,
    team: TeamClient,
    content: bytes = PREFERENCE,
    purpose: str = "train",
    filename: str = "data.jsonl",
    headers: dict | None = None,
):
    return client.post(
        "/v1/files",
        headers={**team.headers, **(headers or {})},
        files={"file": (filename, content, "application/jsonl")},
        data={"purpose": purpose},
    )


def stored_objects(store) -> list[str]:
    """Every object in the store, and any leftover temp file."""
    root = Path(store.root)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def train_file(client, team_a) -> str:
    r = upload(client, team_a)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def job_body(file_id: str, **overrides) -> dict:
    # batch 4: the 4-pair PREFERENCE file (a larger default batch is fitted with a warning)
    return {
        "base_model": "tiny-llama", "training_file": file_id, "objective": "dpo", "batch_size": 4,
        **overrides,
    }


def checkpoint_file(client, headers: dict, job_id: str, step: int, name: str, **kw):
    """GET a file of a job's checkpoint (`kw`: follow_redirects=False, to see a redirect)."""
    url = f"/v1/jobs/{job_id}/checkpoints/{step}/download"
    return client.get(url, headers=headers, params={"file": name}, **kw)


def presigned_checkpoint_file(client, headers: dict, job_id: str, step: int, name: str):
    """The file fetched from the presigned URL its download redirects to (an S3 store)."""
    r = checkpoint_file(client, headers, job_id, step, name, follow_redirects=False)
    assert r.status_code == 307, r.text
    return httpx.get(r.headers["location"], timeout=10)


def create_job(client, team: TeamClient, file_id: str, **overrides) -> dict:
    """POST /v1/jobs with job_body(file_id, **overrides); the 201's job."""
    r = client.post("/v1/jobs", headers=team.headers, json=job_body(file_id, **overrides))
    assert r.status_code == 201, r.text
    return r.json()


def job_rows(db_sessions) -> int:
    with db_sessions() as s:
        return s.execute(select(func.count()).select_from(Job)).scalar_one()


def claim_job(db_sessions, job_id: str, worker: str = "w1") -> None:
    """The job claimed by `worker`, as a worker would (models.jobs.claim)."""
    with db_sessions() as s:
        assert job_states.claim(s, job_id, worker, 60) is not None
        s.commit()


def finish_job(db_sessions, job_id: str, status: str = "succeeded", worker: str = "w1") -> None:
    with db_sessions() as s:
        assert job_states.finish(s, job_id, worker, status)
        s.commit()
