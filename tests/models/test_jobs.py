"""The job state machine: guarded transitions, claims, leases, the reaper (both backends)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from models import jobs
from models.base import utcnow
from models.tables import JOB_STATUSES, Checkpoint, Job, JobEvent, JobMetric
from models.teams import create_team
from tests.fixtures.concurrency import at_once

SPEC = {"base_model": "tiny-llama", "training_file": "file-x", "objective": {"name": "dpo"}}


@pytest.fixture
def team_id(db_sessions):
    with db_sessions() as s:
        team = create_team(s, "acme")
        s.commit()
        return team.id


@pytest.fixture
def new_job(db_sessions, team_id):
    def make(**spec_overrides) -> str:
        with db_sessions() as s:
            job = jobs.create_job(
                s, team_id=team_id, spec={**SPEC, **spec_overrides}, metadata={"k": "v"}
            )
            s.commit()
            return job.id

    return make


def _events(session, job_id) -> list[JobEvent]:
    return list(
        session.execute(
            select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.seq)
        ).scalars()
    )


def _status(sessions, job_id) -> str:
    with sessions() as s:
        return s.get(Job, job_id).status


def _expire_lease(sessions, job_id, seconds_ago=5):
    with sessions() as s:
        s.get(Job, job_id).lease_expires_at = utcnow() - timedelta(seconds=seconds_ago)
        s.commit()


def test_create_job_is_queued_with_created_and_status_events(db_sessions, new_job):
    job_id = new_job()
    with db_sessions() as s:
        job = s.get(Job, job_id)
        assert job.status == "queued" and job.attempt == 0 and job.meta == {"k": "v"}
        assert job.objective == "dpo" and job.base_model == "tiny-llama"
        events = _events(s, job_id)
    assert [(e.seq, e.kind) for e in events] == [(1, "created"), (2, "status")]
    assert events[1].data == {"from": "validating", "to": "queued"}
    assert job_id.startswith("job-")


def test_transition_is_guarded_and_records_an_event(db_sessions, new_job):
    job_id = new_job()
    with db_sessions() as s:
        assert jobs.transition(s, job_id, "running", "succeeded") is False  # not running
        assert (
            jobs.transition(
                s,
                job_id,
                ["validating", "queued"],
                "failed",
                error={"message": "boom", "type": "test"},
            )
            is True
        )
        s.commit()
        assert jobs.transition(s, job_id, "queued", "cancelled") is False  # already failed
        job = s.get(Job, job_id)
        assert job.status == "failed" and job.error["message"] == "boom"
        assert job.finished_at is not None
        events = _events(s, job_id)
    assert [e.data for e in events[2:]] == [{"from": "queued", "to": "failed"}]


def test_transition_refuses_moves_the_machine_forbids(db_session, new_job):
    job_id = new_job()
    with pytest.raises(jobs.InvalidTransition):
        jobs.transition(db_session, job_id, "succeeded", "running")
    with pytest.raises(jobs.InvalidTransition):
        jobs.transition(db_session, job_id, ["queued", "cancelled"], "running")
    assert jobs.transition(db_session, "job-missing", "queued", "running") is False


def test_every_status_has_rules_and_terminal_ones_have_none():
    assert set(jobs.TRANSITIONS) == set(JOB_STATUSES)
    for status in ("succeeded", "failed", "cancelled"):
        assert jobs.TRANSITIONS[status] == frozenset() and jobs.is_terminal(status)
    assert jobs.can_transition("queued", "running") and not jobs.can_transition(
        "queued", "succeeded"
    )


def test_claim_race_has_exactly_one_winner(db_sessions, new_job):
    job_id = new_job()

    def worker(i: int) -> str | None:
        with db_sessions() as s:
            job = jobs.claim(s, job_id, f"worker-{i}", 60)
            s.commit()
            return None if job is None else job.lease_owner

    won = [owner for owner in at_once(8, worker, timeout=30) if owner is not None]
    assert len(won) == 1
    with db_sessions() as s:
        job = s.get(Job, job_id)
        assert job.status == "running" and job.attempt == 1 and job.lease_owner == won[0]
        running = [e for e in _events(s, job_id) if e.data and e.data.get("to") == "running"]
    assert len(running) == 1 and running[0].data["worker"] == won[0]


def test_two_sessions_claim_the_same_job_one_wins(db_sessions, new_job):
    job_id = new_job()
    with db_sessions() as a, db_sessions() as b:
        first = jobs.claim(a, job_id, "a", 60)
        a.commit()
        second = jobs.claim(b, job_id, "b", 60)
        b.commit()
    assert first is not None and first.lease_owner == "a" and second is None


def test_claim_takes_over_an_expired_lease_only(db_sessions, new_job):
    job_id = new_job()
    with db_sessions() as s:
        assert jobs.claim(s, job_id, "a", 60) is not None
        s.commit()
        assert jobs.claim(s, job_id, "b", 60) is None  # a's lease is alive
        s.commit()
    _expire_lease(db_sessions, job_id)
    with db_sessions() as s:
        job = jobs.claim(s, job_id, "b", 60)
        s.commit()
        assert job is not None and job.lease_owner == "b" and job.attempt == 2
        last = _events(s, job_id)[-1]
        assert last.data["previous_worker"] == "a" and last.data["from"] == "running"
        started = job.started_at
        assert started is not None
        # a's heartbeat now fails: it must stop
        assert jobs.heartbeat(s, job_id, "a", 60) is None


def test_claim_does_not_take_finished_or_cancelling_jobs(db_sessions, new_job):
    job_id = new_job()
    with db_sessions() as s:
        jobs.claim(s, job_id, "a", 60)
        jobs.request_cancel(s, job_id)
        s.commit()
    _expire_lease(db_sessions, job_id)
    with db_sessions() as s:
        assert jobs.claim(s, job_id, "b", 60) is None
        assert jobs.claim(s, "job-missing", "b", 60) is None


def test_heartbeat_extends_the_lease_records_progress_and_reports_cancelling(db_sessions, new_job):
    job_id = new_job()
    with db_sessions() as s:
        job = jobs.claim(s, job_id, "w", 10)
        s.commit()
        before = job.lease_expires_at
        assert jobs.heartbeat(s, job_id, "w", 100, current_step=3, total_steps=10) == "running"
        s.commit()
        job = s.get(Job, job_id)
        assert job.lease_expires_at > before and (job.current_step, job.total_steps) == (3, 10)
        assert jobs.heartbeat(s, job_id, "intruder", 100) is None
        assert jobs.request_cancel(s, job_id) == "cancelling"
        s.commit()
        assert jobs.heartbeat(s, job_id, "w", 100) == "cancelling"
        assert jobs.finish(s, job_id, "w", "cancelled") is True
        s.commit()
        job = s.get(Job, job_id)
        assert job.status == "cancelled" and job.lease_owner is None
        assert jobs.heartbeat(s, job_id, "w", 100) is None


def test_finish_needs_the_lease(db_sessions, new_job):
    job_id = new_job()
    with db_sessions() as s:
        jobs.claim(s, job_id, "w", 60)
        s.commit()
        assert jobs.finish(s, job_id, "other", "succeeded") is False
        assert jobs.finish(s, job_id, "w", "cancelled") is False  # not asked to cancel
        with pytest.raises(jobs.InvalidTransition):
            jobs.finish(s, job_id, "w", "running")
        assert jobs.finish(s, job_id, "w", "succeeded", result={"checkpoint": 4}) is True
        s.commit()
        job = s.get(Job, job_id)
        assert job.status == "succeeded" and job.result == {"checkpoint": 4}
        assert job.finished_at is not None and job.lease_expires_at is None


def test_release_requeues_a_running_job(db_sessions, new_job):
    job_id = new_job()
    with db_sessions() as s:
        jobs.claim(s, job_id, "w", 60)
        assert jobs.release(s, job_id, "other") is False
        assert jobs.release(s, job_id, "w", "worker shutting down") is True
        s.commit()
        job = s.get(Job, job_id)
        assert job.status == "queued" and job.lease_owner is None
        assert jobs.claim(s, job_id, "w2", 60).attempt == 2


def test_request_cancel_moves(db_sessions, new_job):
    queued, running, done = new_job(), new_job(), new_job()
    with db_sessions() as s:
        jobs.claim(s, running, "w", 60)
        jobs.claim(s, done, "w", 60)
        jobs.finish(s, done, "w", "failed", error={"message": "x", "type": "t"})
        s.commit()
        assert jobs.request_cancel(s, queued) == "cancelled"
        assert jobs.request_cancel(s, running) == "cancelling"
        assert jobs.request_cancel(s, running) == "cancelling"  # repeating is fine
        assert jobs.request_cancel(s, done) is None
        assert jobs.request_cancel(s, "job-missing") is None
        s.commit()
    assert _status(db_sessions, queued) == "cancelled"


def test_reaper_requeues_expired_leases_and_leaves_live_ones(db_sessions, new_job):
    dead, alive, stopping, exhausted = new_job(), new_job(), new_job(), new_job()
    with db_sessions() as s:
        for job_id in (dead, alive, stopping, exhausted):
            jobs.claim(s, job_id, f"w-{job_id}", 60)
        jobs.request_cancel(s, stopping)
        s.commit()
    for job_id in (dead, stopping, exhausted):
        _expire_lease(db_sessions, job_id)
    with db_sessions() as s:
        s.get(Job, exhausted).attempt = 5
        s.commit()
        requeued = jobs.reap_expired(s, max_attempts=5)
        s.commit()
    assert requeued == [dead]
    assert _status(db_sessions, dead) == "queued"
    assert _status(db_sessions, alive) == "running"
    assert _status(db_sessions, stopping) == "cancelled"
    assert _status(db_sessions, exhausted) == "failed"
    with db_sessions() as s:
        assert s.get(Job, exhausted).error["type"] == "worker_lost"
        assert s.get(Job, dead).lease_owner is None
        last = _events(s, dead)[-1]
        assert last.data["to"] == "queued" and "expired" in last.message
        # the dead worker's late heartbeat fails; a new claim resumes it as attempt 2
        assert jobs.heartbeat(s, dead, f"w-{dead}", 60) is None
        assert jobs.claim(s, dead, "w-new", 60).attempt == 2
        s.commit()
        assert jobs.reap_expired(s) == []


def test_reaper_loses_to_a_heartbeat(db_sessions, new_job):
    job_id = new_job()
    with db_sessions() as s:
        jobs.claim(s, job_id, "w", 60)
        s.commit()
    _expire_lease(db_sessions, job_id)
    with db_sessions() as s:
        # the worker renews just before the reaper's guarded UPDATE
        assert jobs.heartbeat(s, job_id, "w", 60) == "running"
        s.commit()
        assert jobs.reap_expired(s, now=utcnow()) == []
    assert _status(db_sessions, job_id) == "running"


def test_stale_queued_lists_forgotten_jobs(db_sessions, new_job):
    job_id = new_job()
    with db_sessions() as s:
        assert jobs.stale_queued(s, 60) == []
        assert jobs.stale_queued(s, 60, now=utcnow() + timedelta(minutes=5)) == [job_id]


def test_event_seqs_are_unique_and_gapless_under_concurrency(db_sessions, new_job):
    job_id = new_job()
    n, per = 4, 10

    def writer(i: int) -> None:
        for j in range(per):
            with db_sessions() as s:
                jobs.add_event(s, job_id, "log", f"{i}-{j}")
                s.commit()

    at_once(n, writer)
    with db_sessions() as s:
        seqs = [e.seq for e in _events(s, job_id)]
        assert s.get(Job, job_id).event_seq == len(seqs)
    assert seqs == list(range(1, 2 + n * per + 1))
    with db_sessions() as s, pytest.raises(LookupError):
        jobs.add_event(s, "job-missing", "log")


def test_metrics_merge_per_step_and_checkpoints_upsert(db_sessions, new_job):
    job_id = new_job()
    with db_sessions() as s:
        jobs.record_metrics(s, job_id, 1, {"loss": 1.0})
        jobs.record_metrics(s, job_id, 1, {"loss": 0.9, "kl": 0.1})  # replayed after resume
        jobs.record_metrics(s, job_id, 2, {"loss": 0.8})
        jobs.add_checkpoint(s, job_id, 2, "t/j/step-2/", bytes=10, files=["a"])
        jobs.add_checkpoint(s, job_id, 2, "t/j/step-2/", bytes=12, files=["a", "b"])
        jobs.add_checkpoint(s, job_id, 1, "t/j/step-1/", bytes=5)
        s.commit()
        values = dict(s.execute(select(JobMetric.step, JobMetric.values)).tuples().all())
        assert values == {1: {"loss": 0.9, "kl": 0.1}, 2: {"loss": 0.8}}
        assert s.execute(select(func.count()).select_from(Checkpoint)).scalar() == 2
        latest = jobs.latest_checkpoint(s, job_id)
        assert (latest.step, latest.bytes, latest.files) == (2, 12, ["a", "b"])
        kinds = [e.kind for e in _events(s, job_id)]
        assert kinds.count("checkpoint") == 3


def test_active_job_count(db_sessions, new_job, team_id):
    a, _ = new_job(), new_job()
    with db_sessions() as s:
        assert jobs.active_job_count(s, team_id) == 2
        jobs.request_cancel(s, a)
        s.commit()
        assert jobs.active_job_count(s, team_id) == 1


def test_within_quota_counts_every_active_job(db_sessions, new_job, team_id):
    new_job(), new_job()
    with db_sessions() as s:
        assert jobs.within_quota(s, team_id, 2)
        assert not jobs.within_quota(s, team_id, 1)
        assert jobs.within_quota(s, team_id, 2 + jobs.QUOTA_HEADROOM)  # the unlocked path


def test_within_quota_locks_the_team_only_near_the_limit(db_sessions, new_job, team_id, db_url):
    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite has no row locks")
    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError

    from models.tables import Team

    new_job()
    with db_sessions() as holder, db_sessions() as s:
        # another create of this team, between its quota check and its commit
        holder.execute(select(Team.id).where(Team.id == team_id).with_for_update(key_share=True))
        s.execute(text("SET LOCAL lock_timeout = '300ms'"))
        assert jobs.within_quota(s, team_id, 1 + jobs.QUOTA_HEADROOM)  # far: no wait
        with pytest.raises(OperationalError, match="lock timeout"):
            jobs.within_quota(s, team_id, 10)  # near the limit: waits its turn
        holder.rollback()


def test_non_finite_metrics_are_stored_as_null_on_both_backends(db_sessions, new_job):
    """A diverged loss must not fail the worker's write (PostgreSQL's jsonb refuses NaN) nor
    leave text no strict reader accepts (SQLite): JSON columns store it as null."""
    job_id = new_job()
    with db_sessions() as s:
        jobs.record_metrics(s, job_id, 1, {"loss": float("nan"), "grad_norm": float("inf")})
        jobs.add_event(s, job_id, "warning", "diverged", {"loss": float("-inf")})
        s.commit()
    with db_sessions() as s:
        metric = s.scalars(select(JobMetric).where(JobMetric.job_id == job_id)).one()
        assert metric.values == {"loss": None, "grad_norm": None}
        assert _events(s, job_id)[-1].data == {"loss": None}


def test_text_that_is_not_unicode_is_refused_on_both_backends(db_sessions, team_id):
    """A lone surrogate (JSON's "\\ud800") or an integer beyond 64 bits is refused before
    anything is written, on SQLite as on PostgreSQL (SQLite would store the surrogate, and
    every later read of the row would fail), as one exception the API answers with a 422."""
    from models.db import UnstorableValue

    for metadata, spec in (({"k": "\ud800"}, SPEC), ({}, {**SPEC, "seed": 2**64})):
        with db_sessions() as s:
            with pytest.raises(UnstorableValue):
                jobs.create_job(s, team_id=team_id, spec=spec, metadata=metadata)
                s.flush()
            s.rollback()
            assert s.scalar(select(func.count()).select_from(Job)) == 0
