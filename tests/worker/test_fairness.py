"""Fair scheduling across teams with the real engines (issue 14, finding 3): team A has 20 long
jobs queued, team B submits one, and B's job starts at the next free slot, in the embedded
worker and under Celery; a team at its TEAM_MAX_RUNNING never holds a Celery worker, and its
next job starts when one of its jobs ends. The fake trainer (tests/worker/fake_trainer.py)
stands in for training: the scheduling, not the steps, is under test."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from sqlalchemy import select

from models import jobs as job_states
from models.tables import Job
from models.teams import create_api_key, create_team
from tests.worker import fake_trainer
from tests.worker.conftest import PREFERENCE, TINY, wait_for
from worker import embedded

LONG = {"STEPS": "100000", "SLEEP": "0.05", "LOAD_SLEEP": "0", "LOG_EVERY": "1"}
QUEUED_AHEAD = 20


def _started(sessions) -> list[str]:
    """Jobs that ever started, in the order they did."""
    with sessions() as s:
        return list(
            s.execute(
                select(Job.id).where(Job.started_at.is_not(None)).order_by(Job.started_at)
            ).scalars()
        )


def _status(sessions, job_id: str) -> str:
    with sessions() as s:
        return s.get(Job, job_id).status


def _running_of(sessions, team_id: str) -> int:
    with sessions() as s:
        rows = s.execute(
            select(Job.id).where(Job.team_id == team_id, Job.status.in_(("running", "cancelling")))
        ).all()
        return len(rows)


def _cancel(sessions, job_id: str) -> None:
    with sessions() as s:
        job_states.request_cancel(s, job_id)
        s.commit()


def _figure(engine: str, b_job: str, sessions, t_free: float, t_b: float) -> None:
    order = _started(sessions)
    assert order.index(b_job) == 1  # the first job to start after A's first
    print(
        f"FAIRNESS {engine}: B's job was {QUEUED_AHEAD}th in line ({QUEUED_AHEAD - 1} of A's "
        f"queued ahead); it started at the 1st free slot, {t_b - t_free:.1f} s after the slot "
        f"was freed (first-in-first-out: at the {QUEUED_AHEAD}th)"
    )


def test_embedded_worker_starts_team_bs_job_at_the_next_free_slot(local, tmp_path, monkeypatch):
    for name, value in LONG.items():
        monkeypatch.setenv(name, value)
    settings = local.settings.model_copy(
        update={"TRAINER_PYTHON": str(fake_trainer.install(tmp_path))}
    )
    a = [local.make_job(max_steps=5) for _ in range(QUEUED_AHEAD)]
    for job_id in a:
        embedded.enqueue(job_id)
    embedded.start(settings)
    try:
        wait_for(lambda: _status(local.sessions, a[0]) == "running", 30, what="A's first job")
        with local.sessions() as s:
            team_b = create_team(s, "b").id
            s.commit()
        b = dataclasses.replace(local, team_id=team_b).make_job(max_steps=5)
        embedded.enqueue(b)  # what the API does after its commit: behind A's 19 queued
        time.sleep(1.0)
        assert _started(local.sessions) == [a[0]]

        t_free = time.monotonic()
        _cancel(local.sessions, a[0])  # the one slot frees at A's next step
        wait_for(lambda: _status(local.sessions, b) == "running", 30, what="B's job to start")
        t_b = time.monotonic()
        assert _started(local.sessions) == [a[0], b]
        assert _status(local.sessions, a[0]) == "cancelled"
        assert all(_status(local.sessions, j) == "queued" for j in a[1:])
        _figure("embedded", b, local.sessions, t_free, t_b)
    finally:
        embedded.stop()


# --- Celery: PostgreSQL, Redis, real worker processes -------------------------------------------


def _team(stack, name: str) -> dict[str, str]:
    with stack.sessions() as s:
        team = create_team(s, name)
        _, secret = create_api_key(s, team.id)
        s.commit()
    return {"Authorization": f"Bearer {secret}"}


def _submit(stack, headers: dict[str, str]) -> str:
    r = stack.client.post(
        "/v1/files",
        headers=headers,
        files={"file": ("train.jsonl", PREFERENCE, "application/jsonl")},
        data={"purpose": "train"},
    )
    assert r.status_code == 201, r.text
    r = stack.client.post(
        "/v1/jobs", headers=headers, json={**TINY, "training_file": r.json()["id"], "max_steps": 5}
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _workers_env(stack, tmp_path, **extra: str) -> dict[str, Any]:
    return {
        **stack.env,
        **LONG,
        "TRAINER_PYTHON": str(fake_trainer.install(tmp_path)),
        **extra,
    }


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
def test_celery_starts_team_bs_job_at_the_next_free_slot(stack, celery_workers, tmp_path):
    stack.client.app.state.settings.MAX_JOBS_PER_TEAM = QUEUED_AHEAD  # A may queue 20
    celery_workers.start(_workers_env(stack, tmp_path))  # one slot
    a = [stack.submit(stack.upload(), max_steps=5) for _ in range(QUEUED_AHEAD)]
    wait_for(lambda: _status(stack.sessions, a[0]) == "running", 60, what="A's first job")
    b = _submit(stack, _team(stack, "b"))
    time.sleep(1.0)
    assert _started(stack.sessions) == [a[0]]

    t_free = time.monotonic()
    r = stack.client.post(f"/v1/jobs/{a[0]}/cancel", headers=stack.headers)
    assert r.status_code == 200 and r.json()["status"] == "cancelling"
    wait_for(lambda: _status(stack.sessions, b) == "running", 60, what="B's job", interval=0.1)
    t_b = time.monotonic()
    assert _started(stack.sessions) == [a[0], b], celery_workers.logs()
    assert all(_status(stack.sessions, j) == "queued" for j in a[1:])
    _figure("celery", b, stack.sessions, t_free, t_b)


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
def test_celery_a_team_at_its_limit_never_holds_a_worker(stack, celery_workers, tmp_path):
    """TEAM_MAX_RUNNING=1, two workers: A's second job does not take the second worker (its
    wake-up is dropped at once), B's job does; when A's first job ends, its worker wakes A's
    second, long before the stale-queued sweep (120 s here) would."""
    env = _workers_env(stack, tmp_path, TEAM_MAX_RUNNING="1")
    workers = [celery_workers.start(env, name=f"w{i}") for i in range(2)]
    with stack.sessions() as s:
        team_a = s.get(Job, a1 := stack.submit(stack.upload(), max_steps=5)).team_id
    a2 = stack.submit(stack.upload(), max_steps=5)
    wait_for(lambda: _status(stack.sessions, a1) == "running", 60, what="A's first job")
    wait_for(
        lambda: sum(w.log().count("not claimable") for w in workers) >= 1,
        60,
        what="A's second wake-up to be dropped",
    )
    assert _status(stack.sessions, a2) == "queued"

    b = _submit(stack, _team(stack, "b"))
    wait_for(lambda: _status(stack.sessions, b) == "running", 60, what="B's job on the free worker")
    assert _running_of(stack.sessions, team_a) == 1 and _status(stack.sessions, a2) == "queued"

    t0 = time.monotonic()
    r = stack.client.post(f"/v1/jobs/{a1}/cancel", headers=stack.headers)
    assert r.status_code == 200
    wait_for(lambda: _status(stack.sessions, a2) == "running", 60, what="A's second job")
    took = time.monotonic() - t0
    assert took < 60 and _status(stack.sessions, a1) == "cancelled"
    assert _running_of(stack.sessions, team_a) == 1
    print(f"FAIRNESS limit: A's second job started {took:.1f} s after its first was cancelled")
