"""The reaper sweep: expired leases are requeued and re-sent, lost messages re-sent once per
period, whatever number of workers sweep at once."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import update

from models import jobs as job_states
from models.base import utcnow
from models.tables import Job
from models.teams import create_team
from tests.worker.conftest import Local
from worker.reaper import ReaperThread, reap_and_requeue, reaper_options, take_stale_queued


@pytest.fixture
def local(db_sessions, local_store, worker_settings) -> Local:
    """On both backends (SQLite and PostgreSQL): the sweeps are all about guarded UPDATEs."""
    with db_sessions() as s:
        team = create_team(s, "acme")
        s.commit()
        return Local(db_sessions, local_store, worker_settings, team.id)


def _age(local, job_id: str, seconds: float, **values) -> None:
    with local.sessions() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(updated_at=utcnow() - timedelta(seconds=seconds), **values)
        )
        s.commit()


def test_expired_leases_are_requeued_and_sent(local):
    dead, alive, cancelling, exhausted, fresh = (local.make_job() for _ in range(5))
    with local.sessions() as s:
        for job_id in (dead, alive, cancelling, exhausted):
            job_states.claim(s, job_id, "w1", lease_seconds=60)
        job_states.request_cancel(s, cancelling)
        s.commit()
    past = utcnow() - timedelta(seconds=1)
    for job_id in (dead, cancelling, exhausted):
        _age(local, job_id, 0, lease_expires_at=past)
    _age(local, exhausted, 0, attempt=5)

    sent: list[str] = []
    got = reap_and_requeue(local.sessions, sent.append, max_attempts=5, stale_queued_seconds=600)
    assert got == sent == [dead]
    status = {j: local.job(j).status for j in (dead, alive, cancelling, exhausted, fresh)}
    assert status == {
        dead: "queued",
        alive: "running",
        cancelling: "cancelled",
        exhausted: "failed",
        fresh: "queued",
    }
    assert local.job(exhausted).error["type"] == "worker_lost"
    assert (
        reap_and_requeue(local.sessions, sent.append, max_attempts=5, stale_queued_seconds=600)
        == []
    )


def test_stale_queued_jobs_are_sent_again_once_per_period(local):
    stale, recent = local.make_job(), local.make_job()
    _age(local, stale, 120)
    sent: list[str] = []
    assert reap_and_requeue(
        local.sessions, sent.append, max_attempts=5, stale_queued_seconds=60
    ) == [stale]
    # Taken: the next sweeps (this worker's or another's) leave it for a period.
    assert take_stale_queued(local.sessions, 60) == []
    assert recent not in sent


def test_concurrent_sweeps_send_each_job_once(local):
    job_ids = [local.make_job() for _ in range(4)]
    for job_id in job_ids:
        _age(local, job_id, 120)
    sent: list[str] = []
    lock = threading.Lock()

    def send(job_id: str) -> None:
        with lock:
            sent.append(job_id)

    threads = [
        threading.Thread(
            target=reap_and_requeue,
            args=(local.sessions, send),
            kwargs={"max_attempts": 5, "stale_queued_seconds": 60},
        )
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(sent) == sorted(job_ids)


def test_a_failing_send_leaves_the_job_queued(local):
    job_id = local.make_job()
    _age(local, job_id, 120)

    def broken(_: str) -> None:
        raise ConnectionError("broker down")

    assert reap_and_requeue(local.sessions, broken, max_attempts=5, stale_queued_seconds=60) == []
    assert local.job(job_id).status == "queued"  # re-sent by a later sweep


def test_reaper_thread_sweeps_until_stopped():
    calls = threading.Semaphore(0)

    def sweep():
        calls.release()
        raise RuntimeError("a failing sweep does not stop the thread")

    thread = ReaperThread(sweep, 0.01)
    thread.start()
    for _ in range(3):
        assert calls.acquire(timeout=5)
    thread.stop()
    assert not thread.is_alive()


def test_reaper_options_come_from_the_settings(worker_settings):
    settings = worker_settings.model_copy(
        update={"MAX_JOB_ATTEMPTS": 7, "STALE_QUEUED_SECONDS": 42.0}
    )
    assert reaper_options(settings) == {"max_attempts": 7, "stale_queued_seconds": 42.0}
    first = reaper_options(settings, stale_queued_seconds=1e-6)  # the embedded first sweep
    assert first == {"max_attempts": 7, "stale_queued_seconds": 1e-6}
