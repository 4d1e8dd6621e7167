"""The runner in-process (SQLite, local store): duplicate delivery, failures, lost leases."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import update

from models.base import utcnow
from models.tables import Job
from storage import StorageUnavailableError
from tests.worker.conftest import checkpoint_steps, metric_steps, trainer_pids, wait_for
from worker.attempt import crash_error
from worker.reaper import reap_and_requeue
from worker.runner import Runner


def _runner(local) -> Runner:
    return Runner(local.settings, local.sessions, local.store)


# The trainer's file and exit-code protocol without torch (the real trainer runs in the Celery
# and embedded tests): STEPS metric lines, SLEEP seconds apart, a STOP file honoured like the
# trainer does, then MESSAGE on stderr and exit CODE.
FAKE_TRAINER = """#!/bin/sh
# argv: -m trainer run SPEC --out RUN_DIR --no-progress
run="$6"
printf '{"time": 0, "kind": "started", "message": "go", "data": {"total_steps": %s}}\\n' \\
    "$STEPS" >> "$run/events.jsonl"
step=1
while [ "$step" -le "$STEPS" ]; do
    printf '{"step": %s, "time": 0, "loss": 0.69}\\n' "$step" >> "$run/metrics.jsonl"
    if [ -n "$CHECKPOINT" ]; then  # written aside, then renamed: complete when visible
        mkdir -p "$run/checkpoints/step-$step.tmp"
        printf '{"step": %s, "world_size": 1}' "$step" \\
            > "$run/checkpoints/step-$step.tmp/state.json"
        n=$(wc -c < "$run/checkpoints/step-$step.tmp/state.json")  # the commit marker, last
        printf '{"version": 1, "files": [{"path": "state.json", "size": %s}]}' $n \\
            > "$run/checkpoints/step-$step.tmp/_COMPLETE"
        mv "$run/checkpoints/step-$step.tmp" "$run/checkpoints/step-$step"
    fi
    [ -e "$run/STOP" ] && exit 3
    sleep "$SLEEP"
    step=$((step + 1))
done
printf 'Loading: 100%%\\rTraceback (most recent call last):\\n  ...\\n%s\\n' "$MESSAGE" >&2
exit $CODE
"""


def _fake(
    local, tmp_path, monkeypatch, *, code=0, message="", steps=1, sleep=0.0, checkpoint="",
    store=None,
) -> Runner:  # fmt: skip
    script = tmp_path / "fake-python"
    script.write_text(FAKE_TRAINER)
    script.chmod(0o755)
    env = {
        "CODE": code,
        "MESSAGE": message,
        "STEPS": steps,
        "SLEEP": sleep,
        "CHECKPOINT": checkpoint,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    settings = local.settings.model_copy(update={"TRAINER_PYTHON": str(script)})
    return Runner(settings, local.sessions, store or local.store)


@contextmanager
def _training(local, runner: Runner, job_id: str, join: float) -> Iterator[list]:
    """runner.run(job_id) on a thread; the block runs once the trainer logged a step. Yields
    the list the run's outcome is appended to (waited for, up to `join` s, after the block)."""
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(runner.run(job_id)))
    thread.start()
    try:
        wait_for(lambda: metric_steps(local.sessions, job_id), 30, what="training")
        yield outcome
    finally:
        thread.join(join)


def test_duplicate_delivery_does_not_train_twice(local, tmp_path, monkeypatch):
    job_id = local.make_job(max_steps=8)
    first = _fake(local, tmp_path, monkeypatch, steps=8, sleep=0.2)
    with _training(local, first, job_id, join=60) as outcome:
        t0 = time.monotonic()
        assert first.run(job_id) is None  # leased by the first attempt: not claimable
        assert time.monotonic() - t0 < 1
    assert outcome == ["succeeded"]
    assert first.run(job_id) is None  # finished: not claimable either
    job = local.job(job_id)
    assert job.status == "succeeded" and job.attempt == 1
    assert metric_steps(local.sessions, job_id) == list(range(1, 9))
    history = local.events(job_id)
    assert [e.kind for e in history].count("started") == 1
    assert [e.data["to"] for e in history if e.kind == "status"] == [
        "queued", "running", "succeeded",
    ]  # fmt: skip
    # the job's scratch directory is where the settings say, and gone once the job ended
    work = Path(local.settings.WORKER_DIR)
    assert work.is_dir() and not (work / job_id).exists()


def test_lost_lease_stops_the_trainer_and_writes_nothing(local, tmp_path, monkeypatch):
    job_id = local.make_job(max_steps=200)
    runner = _fake(local, tmp_path, monkeypatch, steps=1000, sleep=0.05)
    with _training(local, runner, job_id, join=30) as outcome:
        with local.sessions() as s:  # another worker reclaimed the job
            s.execute(update(Job).where(Job.id == job_id).values(lease_owner="someone-else"))
            s.commit()
        seen = len(local.events(job_id)), len(metric_steps(local.sessions, job_id))
    assert outcome == ["lost"]
    job = local.job(job_id)
    assert job.status == "running" and job.lease_owner == "someone-else"
    # Nothing written after the takeover: the fenced transaction was rolled back.
    assert (len(local.events(job_id)), len(metric_steps(local.sessions, job_id))) == seen
    assert trainer_pids(job_id) == []


def test_invalid_spec_exit_fails_the_job(local, tmp_path, monkeypatch):
    job_id = local.make_job(max_steps=1)
    runner = _fake(local, tmp_path, monkeypatch, code=2, message="not_a_field: Extra inputs")
    assert runner.run(job_id) == "failed"
    job = local.job(job_id)
    assert job.error["type"] == "invalid_spec" and job.error["exit_code"] == 2
    assert job.error["message"] == "the trainer exited with code 2: not_a_field: Extra inputs"


def test_trainer_crash_fails_with_the_stderr_tail_after_recording_its_output(
    local, tmp_path, monkeypatch
):
    job_id = local.make_job(max_steps=3)
    message = "RuntimeError: CUDA out of memory"
    runner = _fake(local, tmp_path, monkeypatch, code=1, message=message, steps=3)
    assert runner.run(job_id) == "failed"
    job = local.job(job_id)
    assert job.error["type"] == "trainer_error" and job.error["exit_code"] == 1
    assert job.error["message"] == f"the trainer exited with code 1: {message}"
    assert "Traceback" in job.error["stderr_tail"]
    assert metric_steps(local.sessions, job_id) == [1, 2, 3]  # what it wrote is kept
    assert job.total_steps == 3 and job.result["step"] == 3


def test_a_stop_nobody_asked_for_is_a_failure(local, tmp_path, monkeypatch):
    job_id = local.make_job(max_steps=3)
    runner = _fake(local, tmp_path, monkeypatch, code=3, steps=1)
    assert runner.run(job_id) == "failed"
    assert local.job(job_id).error["message"] == "the trainer stopped without being asked to"


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


def test_a_crash_error_takes_the_last_line(tmp_path):
    path = tmp_path / "stderr.log"
    path.write_text("Loading: 10%\rLoading: 100%\nTraceback ...\nValueError: boom\n\n")

    def error(rc, where=path, limit=4000):
        return crash_error("the trainer", "trainer_error", where, rc, limit)

    assert error(1)["message"] == "the trainer exited with code 1: ValueError: boom"
    assert error(1)["type"] == "trainer_error" and error(1)["exit_code"] == 1
    assert error(-9)["message"] == "the trainer was killed by signal 9"
    assert error(1, tmp_path / "nope", 100)["stderr_tail"] == ""


def test_a_job_asking_for_more_gpus_than_it_can_place_fails(local):
    job_id = local.make_job(max_steps=2, metadata={"gpus": "2"})
    assert _runner(local).run(job_id) == "failed"
    error = local.job(job_id).error
    assert error["type"] == "placement_error" and "set WORKER_GPUS" in error["message"]


class FlakyStore:
    """The local store, but checkpoint uploads fail (S3 down)."""

    def __init__(self, store):
        self.store = store

    def __getattr__(self, name):
        return getattr(self.store, name)

    def upload_dir(self, prefix, local_dir):
        raise StorageUnavailableError("S3 is down")


def test_a_store_outage_is_not_reported_as_done(local, tmp_path, monkeypatch):
    """Checkpoints that cannot be uploaded: the job is neither succeeded nor failed; the lease
    lapses and the reaper requeues it (it resumes from what is durable)."""
    monkeypatch.setattr("worker.progress.time.sleep", lambda _: None)  # upload retry back-off
    job_id = local.make_job(max_steps=2)
    store = FlakyStore(local.store)
    runner = _fake(local, tmp_path, monkeypatch, steps=2, checkpoint="1", store=store)
    assert runner.run(job_id) == "abandoned"
    job = local.job(job_id)
    assert job.status == "running" and job.finished_at is None and job.result is None
    assert checkpoint_steps(local.sessions, job_id) == []
    assert metric_steps(local.sessions, job_id) == [1, 2]
    # the error's type only: a store's message names its endpoint and bucket (worker.attempt)
    warning = local.events(job_id)[-1].message
    assert "StorageUnavailableError" in warning and "S3 is down" not in warning

    with local.sessions() as s:  # the lease runs out
        s.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow()))
        s.commit()
    sent: list[str] = []
    reap_and_requeue(local.sessions, sent.append, max_attempts=5, stale_queued_seconds=None)
    assert sent == [job_id] and local.job(job_id).status == "queued"


def test_checkpoints_are_recorded_in_step_order(local):
    """A checkpoint event can be read before its directory was uploaded: the history waits
    there, so checkpoints (and what the trainer logged after them) land in the trainer's order,
    each checkpoint only once its objects are in the store."""
    import json

    from models import jobs as job_states
    from worker.runner import Attempt

    job_id = local.make_job(max_steps=6)
    with local.sessions() as s:
        job = job_states.claim(s, job_id, "w-1", 30)
        s.commit()
    attempt = Attempt(_runner(local), job, "w-1")
    attempt.run_dir.mkdir(parents=True)

    def checkpoint_dir(step: int, commit: bool = True) -> None:
        path = attempt.run_dir / "checkpoints" / f"step-{step}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "state.json").write_text(json.dumps({"step": step, "world_size": 1}))
        if not commit:  # the trainer's ranks are still writing it
            return
        size = (path / "state.json").stat().st_size  # committed: the marker, last
        files = [{"path": "state.json", "size": size}]
        (path / "_COMPLETE").write_text(json.dumps({"version": 1, "files": files}))

    def event(kind: str, **data) -> None:
        with open(attempt.run_dir / "events.jsonl", "a") as fh:
            fh.write(json.dumps({"kind": kind, "message": "", "data": data}) + "\n")

    def history() -> list[tuple[str, int | None]]:
        return [
            (e.kind, e.data.get("step"))
            for e in local.events(job_id)
            if e.kind in ("checkpoint", "finished", "warning")
        ]

    checkpoint_dir(2)
    event("checkpoint", step=2)
    attempt.sync()
    event("checkpoint", step=4)  # its directory shows up only after this sync looked
    event("warning")
    checkpoint_dir(4, commit=False)  # written, not committed yet: not uploaded
    attempt.sync()
    assert history() == [("checkpoint", 2)]
    assert not local.store.is_complete(f"{job.team_id}/{job_id}/step-4/")
    checkpoint_dir(4)
    checkpoint_dir(6)
    event("checkpoint", step=6)
    event("checkpoint")  # malformed (no step): skipped, does not hold the history up
    event("finished", step=6)
    attempt.sync()
    assert history() == [
        ("checkpoint", 2), ("checkpoint", 4), ("warning", None), ("checkpoint", 6),
        ("finished", 6),
    ]  # fmt: skip
    assert all(local.store.is_complete(f"{job.team_id}/{job_id}/step-{n}/") for n in (2, 4, 6))
    # Only the newest stays on local disk; the others are safe in the store.
    assert sorted(p.name for p in (attempt.run_dir / "checkpoints").iterdir()) == ["step-6"]


def test_a_resume_keeps_the_world_size_only_of_a_format_1_checkpoint(local, tmp_path):
    """A format 1 checkpoint holds per-process optimizer and RNG state: its resume must use its
    world size. A DCP checkpoint (format 2) reshards: the attempt places its processes afresh."""
    import json

    from models import jobs as job_states
    from models.tables import Checkpoint
    from worker import inputs
    from worker.runner import Attempt

    job_id = local.make_job(max_steps=6)
    with local.sessions() as s:
        job = job_states.claim(s, job_id, "w-1", 30)
        s.commit()
    attempt = Attempt(_runner(local), job, "w-1")
    attempt.run_dir.mkdir(parents=True)
    worlds = []
    for step, state in ((2, {"world_size": 2}), (4, {"world_size": 2, "format": 2})):
        src = tmp_path / f"step-{step}"
        src.mkdir()
        (src / "state.json").write_text(json.dumps({"step": step, **state}))
        prefix = f"{job.team_id}/{job_id}/step-{step}/"
        local.store.upload_dir(prefix, src)
        with local.sessions() as s:
            s.add(Checkpoint(job_id=job_id, step=step, object_prefix=prefix))
            s.commit()
        worlds.append(inputs.download_checkpoint(attempt))
    assert worlds == [2, None]
