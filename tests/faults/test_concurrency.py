"""Races on PostgreSQL: many workers claiming one job at the Runner level, and 50 concurrent
creates with one Idempotency-Key through a real uvicorn server.

(Duplicate Celery deliveries are covered by tests/worker/test_runner.py::
test_duplicate_delivery_does_not_train_twice and the reaper's concurrent sweeps by
tests/worker/test_reaper.py::test_concurrent_sweeps_send_each_job_once.)
"""

from __future__ import annotations

import httpx
from sqlalchemy import func, select

from models.tables import File, IdempotencyKey, Job
from models.teams import create_team
from storage import open_store
from tests.api.conftest import PREFERENCE, job_body, stored_objects
from tests.fixtures.concurrency import at_once
from tests.worker.conftest import Local, events, metric_steps
from tests.worker.test_runner import _fake
from worker.config import WorkerSettings
from worker.runner import Runner

RACERS = 8
SUBMITTERS = 50


def test_many_runners_racing_for_one_job_only_one_claims(
    db_url, db_sessions, tmp_path, monkeypatch
):
    settings = WorkerSettings(
        DATABASE_URL=db_url,
        BROKER_URL="memory://",
        STORAGE_URL=f"file://{tmp_path / 'objects'}",
        LEASE_SECONDS=30,
        HEARTBEAT_SECONDS=1,
        WORKER_DIR=str(tmp_path / "work"),
        WORKER_POLL_SECONDS=0.1,
        LOG_LEVEL="WARNING",
    )
    with db_sessions() as s:
        team_id = create_team(s, "race").id
        s.commit()
    local = Local(db_sessions, open_store(settings.STORAGE_URL), settings, team_id)
    job_id = local.make_job(max_steps=3)
    first = _fake(local, tmp_path, monkeypatch, steps=3, sleep=0.1)
    runners = [first] + [
        Runner(first.settings, db_sessions, local.store) for _ in range(RACERS - 1)
    ]
    outcomes = at_once(RACERS, lambda i: runners[i].run(job_id))
    assert outcomes.count("succeeded") == 1 and outcomes.count(None) == RACERS - 1, outcomes
    job = local.job(job_id)
    assert job.status == "succeeded" and job.attempt == 1
    assert metric_steps(db_sessions, job_id) == [1, 2, 3]
    history = events(db_sessions, job_id)
    assert [e.kind for e in history].count("started") == 1
    assert [e.seq for e in history] == list(range(1, len(history) + 1))  # no gaps
    assert [e.data["to"] for e in history if e.kind == "status"] == [
        "queued", "running", "succeeded",
    ]  # fmt: skip


def _count(db_sessions, model) -> int:
    with db_sessions() as s:
        return s.execute(select(func.count()).select_from(model)).scalar_one()


def _post_file(base: str, headers: dict[str, str]) -> httpx.Response:
    with httpx.Client(base_url=base, timeout=60) as http:
        return http.post(
            "/v1/files",
            headers=headers,
            files={"file": ("t.jsonl", PREFERENCE, "application/jsonl")},
            data={"purpose": "train"},
        )


def _post_job(base: str, headers: dict[str, str], file_id: str) -> httpx.Response:
    with httpx.Client(base_url=base, timeout=60) as http:
        return http.post("/v1/jobs", headers=headers, json=job_body(file_id))


def test_fifty_concurrent_creates_with_one_idempotency_key_make_one_job(
    live_server, team_a, db_sessions, store, queue
):
    base, key = live_server
    auth = {"Authorization": f"Bearer {key}"}
    r = _post_file(base, auth)
    assert r.status_code == 201, r.text
    file_id = r.json()["id"]
    storm = {**auth, "Idempotency-Key": "storm-1"}

    responses = at_once(SUBMITTERS, lambda _: _post_job(base, storm, file_id))
    codes = sorted(r.status_code for r in responses)
    ok = [r for r in responses if r.status_code == 201]
    assert set(codes) <= {201, 409}, codes  # 409: "in progress" while the winner commits
    assert ok and len({r.json()["id"] for r in ok}) == 1, codes
    assert _count(db_sessions, Job) == 1
    assert len(queue.job_ids) == 1  # sent once
    assert _count(db_sessions, IdempotencyKey) == 1
    # a retry after the storm replays the original
    again = _post_job(base, storm, file_id)
    assert again.status_code == 201 and again.json()["id"] == ok[0].json()["id"]
    assert again.headers.get("idempotent-replayed") == "true"


def test_concurrent_uploads_with_one_key_store_one_file(live_server, db_sessions, store):
    base, key = live_server
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "up-1"}
    responses = at_once(20, lambda _: _post_file(base, headers))
    codes = sorted(r.status_code for r in responses)
    ok = [r for r in responses if r.status_code == 201]
    assert set(codes) <= {201, 409}, codes
    assert ok and len({r.json()["id"] for r in ok}) == 1
    assert _count(db_sessions, File) == 1
    assert len(stored_objects(store)) == 1  # the losers' objects were deleted


def test_concurrent_creates_respect_the_active_job_limit(live_server, settings, db_sessions):
    """Regression (found by the API-kill fault test): the quota was check-then-insert, so a
    burst of creates made 12 jobs under a limit of 10. The team row is now locked."""
    base, key = live_server
    auth = {"Authorization": f"Bearer {key}"}
    file_id = _post_file(base, auth).json()["id"]

    def submit(i: int) -> int:
        return _post_job(base, {**auth, "Idempotency-Key": f"q-{i}"}, file_id).status_code

    codes = at_once(20, submit)
    assert codes.count(201) == settings.MAX_JOBS_PER_TEAM, codes
    assert set(codes) == {201, 429}, codes
    assert _count(db_sessions, Job) == settings.MAX_JOBS_PER_TEAM
