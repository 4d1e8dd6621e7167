"""Worker tests: jobs made directly in the DB for in-process runners (SQLite, local store),
and a full stack (API + PostgreSQL + Redis + SeaweedFS S3 + Celery worker processes)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from celery import Celery  # imported here, before any thread: see Stack.send
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from contract.spec import JobSpec
from models import jobs as job_states
from models.settings import Settings
from models.tables import Checkpoint, Job, JobEvent, JobMetric
from models.teams import create_api_key, create_team
from storage import open_store
from tests.fixtures.rows import add_file
from tests.fixtures.services import REPO, wait_for, wait_job_done  # fixtures: the plugin
from tests.worker.fake_k8s import fake_k8s  # noqa: F401  (the fixture)
from trainer.synthetic import preference_records
from worker.config import WorkerSettings

# tiny-llama, a few hundred ms a step on 2 CPU cores; ~5 s of trainer start-up (torch).
TINY = {
    "base_model": "tiny-llama",
    "objective": "dpo",
    "variant": "offline+humanline",
    "batch_size": 4,
    "max_length": 96,
    "max_prompt_length": 48,
    "quality_sample": 0,
}


def jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


PREFERENCE = jsonl(preference_records(32))


# --- in-process: SQLite + local store -----------------------------------------------------------


@dataclass
class Local:
    sessions: sessionmaker[Session]
    store: Any
    settings: WorkerSettings
    team_id: str

    def make_job(self, data: bytes = PREFERENCE, **spec: Any) -> str:
        """A queued job on a processed training file (what the API would have made)."""
        with self.sessions() as s:
            f = add_file(s, self.store, self.team_id, data, fmt="preference")
            body = JobSpec.model_validate({**TINY, **spec, "training_file": f.id}).model_dump(
                mode="json"
            )  # as the API stores it
            job = job_states.create_job(
                s,
                team_id=self.team_id,
                spec=body,
                metadata=body.get("metadata"),
                training_file_id=f.id,
            )
            s.commit()
            return job.id

    def job(self, job_id: str) -> Job:
        with self.sessions() as s:
            return s.get(Job, job_id)

    def events(self, job_id: str) -> list[JobEvent]:
        return events(self.sessions, job_id)


def _of_job(sessions, table: Any, order: Any, job_id: str, column: Any = None) -> list:
    """The job's rows of `table` (or their `column`) in `order`."""
    query = select(table if column is None else column).where(table.job_id == job_id)
    with sessions() as s:
        return list(s.execute(query.order_by(order)).scalars())


def events(sessions, job_id: str) -> list[JobEvent]:
    return _of_job(sessions, JobEvent, JobEvent.seq, job_id)


def metric_steps(sessions, job_id: str) -> list[int]:
    return _of_job(sessions, JobMetric, JobMetric.step, job_id, column=JobMetric.step)


def checkpoint_steps(sessions, job_id: str) -> list[int]:
    return _of_job(sessions, Checkpoint, Checkpoint.step, job_id, column=Checkpoint.step)


@pytest.fixture
def worker_settings(sqlite_url: str, tmp_path: Path) -> WorkerSettings:
    return WorkerSettings(
        DATABASE_URL=sqlite_url,
        BROKER_URL="memory://",
        STORAGE_URL=f"file://{tmp_path / 'objects'}",
        LEASE_SECONDS=5,
        HEARTBEAT_SECONDS=1,
        REAPER_SECONDS=1,
        WORKER_DIR=str(tmp_path / "work"),
        WORKER_POLL_SECONDS=0.2,
        LOG_LEVEL="WARNING",
    )


@pytest.fixture
def local(worker_settings: WorkerSettings) -> Local:
    from models.db import make_engine, make_session_factory

    sessions = make_session_factory(make_engine(worker_settings.DATABASE_URL))
    with sessions() as s:
        team = create_team(s, "acme")
        s.commit()
        team_id = team.id
    return Local(sessions, open_store(worker_settings.STORAGE_URL), worker_settings, team_id)


@pytest.fixture
def api(local: Local) -> Any:
    """A TestClient of the API over `local`'s database, with a key of its team; the
    embedded worker a test started through it is stopped at the end."""
    from api.main import create_app
    from worker import embedded

    with local.sessions() as s:
        _, secret = create_api_key(s, local.team_id)
        s.commit()
    client = TestClient(create_app(local.settings, session_factory=local.sessions))
    client.headers["Authorization"] = f"Bearer {secret}"
    yield client
    embedded.stop()
    client.close()


# --- the full stack: API, PostgreSQL, Redis, S3, Celery worker processes -------------------------


@dataclass
class Stack:
    env: dict[str, str]  # of the worker processes
    client: TestClient
    headers: dict[str, str]
    sessions: sessionmaker[Session]
    store: Any
    bucket: str
    broker_url: str
    work_dir: Path

    def upload(self, data: bytes = PREFERENCE) -> str:
        r = self.client.post(
            "/v1/files",
            headers=self.headers,
            files={"file": ("train.jsonl", data, "application/jsonl")},
            data={"purpose": "train"},
        )
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def submit(self, file_id: str, **spec: Any) -> str:
        r = self.client.post(
            "/v1/jobs", headers=self.headers, json={**TINY, **spec, "training_file": file_id}
        )
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def get(self, path: str, **params: Any) -> Any:
        r = self.client.get(path, headers=self.headers, params=params)
        assert r.status_code == 200, r.text
        return r.json()

    def job(self, job_id: str) -> dict[str, Any]:
        return self.get(f"/v1/jobs/{job_id}")

    def wait_done(self, job_id: str, timeout: float, logs=lambda: "") -> dict[str, Any]:
        """The job once terminal; fails after `timeout` s without progress or 4× that in all."""
        return wait_job_done(lambda: self.job(job_id), timeout, 4 * timeout, logs)

    def send(self, job_id: str, queue: str) -> None:
        """run_job(job_id) straight onto `queue`, as a second delivery would. (Celery is
        imported at the top of this module: importing it here raced the API's sender thread
        importing it on its first send, and celery's lazy package can fail one of them.)"""
        app = Celery("test-client", broker=self.broker_url)
        app.send_task("worker.tasks.run_job", args=[job_id], queue=queue)
        app.close()


@pytest.fixture
def stack(db_url, db_sessions, s3_server, redis_broker_url, tmp_path) -> Any:
    bucket = s3_server.acquire_bucket()
    s3 = {
        "S3_ENDPOINT_URL": s3_server.endpoint_url,
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
        "AWS_REGION": s3_server.region,
    }
    common = {
        "DATABASE_URL": db_url,
        "BROKER_URL": redis_broker_url,
        "STORAGE_URL": f"s3://{bucket}",
        **s3,
    }
    env = {
        **common,
        "LEASE_SECONDS": "5",
        "HEARTBEAT_SECONDS": "1",
        "REAPER_SECONDS": "1",
        "STALE_QUEUED_SECONDS": "120",
        "WORKER_POLL_SECONDS": "0.2",
        "WORKER_DIR": str(tmp_path / "work"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
    }
    from api.main import create_app

    settings = Settings(**common, LOG_LEVEL="WARNING")
    with db_sessions() as s:
        team = create_team(s, "acme")
        _, secret = create_api_key(s, team.id)
        s.commit()
    store = s3_server.store(bucket)
    client = TestClient(create_app(settings, session_factory=db_sessions))
    try:
        yield Stack(
            env=env,
            client=client,
            headers={"Authorization": f"Bearer {secret}"},
            sessions=db_sessions,
            store=store,
            bucket=bucket,
            broker_url=redis_broker_url,
            work_dir=tmp_path / "work",
        )
    finally:
        client.close()
        s3_server.release_bucket(bucket)


def trainer_pids(job_id: str) -> list[int]:
    """Processes whose command line names the job (its trainer, under WORKER_DIR/job_id)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if job_id.encode() in cmdline and b"trainer" in cmdline:
            pids.append(int(entry.name))
    return pids


__all__ = ["REPO", "wait_for"]
