"""The runner in-process (SQLite, local store): duplicate delivery, failures, lost leases."""

from __future__ import annotations

import threading
import time

from sqlalchemy import update

from models.tables import Job
from tests.worker.conftest import metric_steps, trainer_pids, wait_for
from worker.runner import Runner, stderr_error


def _runner(local) -> Runner:
    return Runner(local.settings, local.sessions, local.store)


def test_duplicate_delivery_does_not_train_twice(local):
    job_id = local.make_job(max_steps=8, checkpoint_every=4)
    first = _runner(local)
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(first.run(job_id)))
    thread.start()
    try:
        wait_for(lambda: metric_steps(local.sessions, job_id), 60, what="training")
        t0 = time.monotonic()
        assert _runner(local).run(job_id) is None  # leased by the first: not claimable
        assert time.monotonic() - t0 < 1
    finally:
        thread.join(120)
    assert outcome == ["succeeded"]
    assert _runner(local).run(job_id) is None  # finished: not claimable either
    job = local.job(job_id)
    assert job.status == "succeeded" and job.attempt == 1
    kinds = [e.kind for e in local.events(job_id)]
    assert kinds.count("started") == 1
    assert (
        sum(1 for e in local.events(job_id) if e.kind == "status" and e.data["to"] == "running")
        == 1
    )


def test_missing_training_file_fails_without_starting_the_trainer(local):
    job_id = local.make_job(max_steps=2)
    with local.sessions() as s:
        key = s.get(Job, job_id).spec["training_file"]
    for k in local.store.list(""):
        if key in k:
            local.store.delete(k)
    assert _runner(local).run(job_id) == "failed"
    job = local.job(job_id)
    assert job.error["type"] == "missing_file"
    assert job.lease_owner is None and job.finished_at is not None


FAKE_TRAINER = """#!/bin/sh
# argv: -m trainer run SPEC --out RUN_DIR --no-progress
run="$6"
printf '{"step": 1, "time": 0, "loss": 0.69}\\n' >> "$run/metrics.jsonl"
printf '{"time": 0, "kind": "started", "message": "go", "data": {"total_steps": 9}}\\n' \\
    >> "$run/events.jsonl"
printf 'Loading: 100%%\\rTraceback (most recent call last):\\n  ...\\n%s\\n' "$MESSAGE" >&2
exit $CODE
"""


def _fake_trainer(local, tmp_path, monkeypatch, code: int, message: str) -> Runner:
    """The trainer's exit-code protocol without torch: a script in its place."""
    script = tmp_path / "fake-python"
    script.write_text(FAKE_TRAINER)
    script.chmod(0o755)
    monkeypatch.setenv("CODE", str(code))
    monkeypatch.setenv("MESSAGE", message)
    settings = local.settings.model_copy(update={"TRAINER_PYTHON": str(script)})
    return Runner(settings, local.sessions, local.store)


def test_invalid_spec_exit_fails_the_job(local, tmp_path, monkeypatch):
    job_id = local.make_job(max_steps=9)
    runner = _fake_trainer(local, tmp_path, monkeypatch, 2, "not_a_field: Extra inputs")
    assert runner.run(job_id) == "failed"
    job = local.job(job_id)
    assert job.error["type"] == "invalid_spec" and job.error["exit_code"] == 2
    assert job.error["message"] == "the trainer exited with code 2: not_a_field: Extra inputs"


def test_trainer_crash_fails_with_the_stderr_tail_after_recording_its_output(
    local, tmp_path, monkeypatch
):
    job_id = local.make_job(max_steps=9)
    runner = _fake_trainer(local, tmp_path, monkeypatch, 1, "RuntimeError: CUDA out of memory")
    assert runner.run(job_id) == "failed"
    job = local.job(job_id)
    assert job.error["type"] == "trainer_error" and job.error["exit_code"] == 1
    assert (
        job.error["message"] == "the trainer exited with code 1: RuntimeError: CUDA out of memory"
    )
    assert "Traceback" in job.error["stderr_tail"]
    assert metric_steps(local.sessions, job_id) == [1]  # what it wrote before dying is kept
    assert job.total_steps == 9 and job.result["step"] == 1
    assert [e.kind for e in local.events(job_id)][-2:] == ["started", "status"]


def test_lost_lease_stops_the_trainer_and_writes_nothing(local):
    job_id = local.make_job(max_steps=200, checkpoint_every=0)
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(_runner(local).run(job_id)))
    thread.start()
    try:
        wait_for(lambda: metric_steps(local.sessions, job_id), 60, what="training")
        with local.sessions() as s:  # another worker reclaimed the job
            s.execute(update(Job).where(Job.id == job_id).values(lease_owner="someone-else"))
            s.commit()
        seen = len(local.events(job_id))
    finally:
        thread.join(30)
    assert outcome == ["lost"]
    job = local.job(job_id)
    assert job.status == "running" and job.lease_owner == "someone-else"
    assert len(local.events(job_id)) == seen  # nothing written after the takeover
    assert trainer_pids(job_id) == []


def test_stderr_error_takes_the_last_line():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "stderr.log"
        path.write_text("Loading: 10%\rLoading: 100%\nTraceback ...\nValueError: boom\n\n")
        error = stderr_error(path, 1, 4000)
        assert error["message"] == "the trainer exited with code 1: ValueError: boom"
        assert stderr_error(path, -9, 4000)["message"] == "the trainer was killed by signal 9"
        assert stderr_error(Path(d) / "nope", 1, 100)["stderr_tail"] == ""


def test_a_job_asking_for_more_gpus_than_it_can_place_fails(local):
    job_id = local.make_job(max_steps=2, metadata={"gpus": "2"})
    assert _runner(local).run(job_id) == "failed"
    error = local.job(job_id).error
    assert error["type"] == "placement_error" and "set WORKER_GPUS" in error["message"]
