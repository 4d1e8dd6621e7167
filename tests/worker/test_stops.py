"""Stopping a running job: a cancel before the first training step, the step a cancelled job
reports, and the per-job wall-clock limit `max_runtime` (issue 14). In-process runner,
SQLite, the fake trainer (tests/worker/fake_trainer.py)."""

from __future__ import annotations

import threading
import time

from sqlalchemy import update

from models import jobs as job_states
from models.tables import Job
from tests.worker import fake_trainer
from tests.worker.conftest import checkpoint_steps, trainer_pids, wait_for
from worker.runner import Runner


def _runner(local, tmp_path, monkeypatch, **env) -> Runner:
    defaults = {"LOAD_SLEEP": 0, "STEPS": 100000, "SLEEP": 0.05, "LOG_EVERY": 1}
    for name, value in {**defaults, **env}.items():
        monkeypatch.setenv(name, str(value))
    settings = local.settings.model_copy(
        update={"TRAINER_PYTHON": str(fake_trainer.install(tmp_path))}
    )
    return Runner(settings, local.sessions, local.store)


def _in_thread(runner: Runner, job_id: str) -> tuple[threading.Thread, list]:
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(runner.run(job_id)))
    thread.start()
    return thread, outcome


def _cancel(local, job_id: str) -> None:
    with local.sessions() as s:
        assert job_states.request_cancel(s, job_id) == "cancelling"
        s.commit()


def _kinds(local, job_id: str) -> list[str]:
    return [e.kind for e in local.events(job_id)]


def test_a_cancel_before_the_first_step_is_honoured_at_once(local, tmp_path, monkeypatch):
    """Finding 12: a job sat in `cancelling` for 100 s while its model loaded (the trainer
    looks at STOP only after a step). Nothing to save yet: the trainer is stopped at once."""
    job_id = local.make_job(max_steps=5)
    runner = _runner(local, tmp_path, monkeypatch, LOAD_SLEEP=120)
    thread, outcome = _in_thread(runner, job_id)
    try:
        wait_for(lambda: trainer_pids(job_id), 30, what="the trainer to start loading")
        t0 = time.monotonic()
        _cancel(local, job_id)
        thread.join(30)
        took = time.monotonic() - t0
    finally:
        thread.join(150)
    assert outcome == ["cancelled"] and took < 15, (outcome, took)
    job = local.job(job_id)
    assert job.status == "cancelled" and job.current_step == 0
    assert job.result["step"] == 0 and job.result["last_checkpoint_step"] is None
    assert local.events(job_id)[-1].message == "cancelled before training started"
    assert "started" not in _kinds(local, job_id)
    assert trainer_pids(job_id) == []


def test_a_cancelled_job_reports_the_step_it_checkpointed(local, tmp_path, monkeypatch):
    """Metrics are logged every LOG_EVERY steps; the stop lands between two. The job reports
    the step of its checkpoint, not the last logged one."""
    job_id = local.make_job(max_steps=5)
    runner = _runner(local, tmp_path, monkeypatch, LOG_EVERY=100000, SLEEP=0.1)
    thread, outcome = _in_thread(runner, job_id)
    try:
        wait_for(lambda: "started" in _kinds(local, job_id), 30, what="training")
        time.sleep(1.0)
        _cancel(local, job_id)
    finally:
        thread.join(60)
    assert outcome == ["cancelled"]
    job = local.job(job_id)
    [step] = checkpoint_steps(local.sessions, job_id)
    assert step > 0
    assert job.result["step"] == job.result["last_checkpoint_step"] == job.current_step == step
    assert local.events(job_id)[-1].message == f"cancelled at step {step}"


def test_max_runtime_checkpoints_and_fails_with_an_event_naming_the_limit(
    local, tmp_path, monkeypatch
):
    job_id = local.make_job(max_steps=5, max_runtime=3)
    runner = _runner(local, tmp_path, monkeypatch)  # would run 100000 × 50 ms
    t0 = time.monotonic()
    assert runner.run(job_id) == "failed"
    assert time.monotonic() - t0 < 20
    job = local.job(job_id)
    [step] = checkpoint_steps(local.sessions, job_id)
    assert step > 0
    assert job.error["type"] == "max_runtime_exceeded" and job.error["step"] == step
    assert job.error["max_runtime"] == 3
    assert job.runtime_seconds >= 3
    assert job.result["step"] == job.result["last_checkpoint_step"] == step
    [event] = [e for e in local.events(job_id) if e.kind == "max_runtime_exceeded"]
    assert "max_runtime of 3 s" in event.message and f"step {step}" in event.message
    status = local.events(job_id)[-1]
    assert status.data["to"] == "failed" and "max_runtime of 3 s" in status.message


def test_max_runtime_counts_every_attempt(local, tmp_path, monkeypatch):
    """A job requeued after its worker was lost keeps the time it already ran."""
    job_id = local.make_job(max_steps=5, max_runtime=100)
    with local.sessions() as s:
        s.execute(update(Job).where(Job.id == job_id).values(runtime_seconds=98.0))
        s.commit()
    runner = _runner(local, tmp_path, monkeypatch)
    t0 = time.monotonic()
    assert runner.run(job_id) == "failed"
    assert time.monotonic() - t0 < 20
    assert local.job(job_id).error["type"] == "max_runtime_exceeded"


def test_a_trainer_that_does_not_stop_is_killed_after_the_grace(local, tmp_path, monkeypatch):
    job_id = local.make_job(max_steps=5, max_runtime=2)
    runner = _runner(local, tmp_path, monkeypatch, IGNORE_STOP=1)
    runner.settings = runner.settings.model_copy(update={"STOP_GRACE_SECONDS": 1.0})
    assert runner.run(job_id) == "failed"
    job = local.job(job_id)
    assert job.error["type"] == "max_runtime_exceeded" and job.error["step"] == 0
    assert job.error["message"] == (
        "stopped at step 0 (no checkpoint yet): the job ran past its max_runtime of 2 s"
    )
    assert trainer_pids(job_id) == []


def test_the_operators_cap_holds_jobs_that_ask_for_more(local, tmp_path, monkeypatch):
    """A row written with a larger max_runtime (before the cap was lowered) is held to the
    workers' cap."""
    job_id = local.make_job(max_steps=5, max_runtime=10_000)
    runner = _runner(local, tmp_path, monkeypatch)
    runner.settings = runner.settings.model_copy(
        update={"CAP_MAX_RUNTIME_SECONDS": 2.0, "MAX_RUNTIME_SECONDS": 1.0}
    )
    assert runner.run(job_id) == "failed"
    assert local.job(job_id).error["max_runtime"] == 2.0
