"""Fair scheduling across teams (models.scheduling): which queued job a free worker claims,
and the per-team limit, enforced at claim time (both backends; the race on PostgreSQL)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from models import jobs, scheduling
from models.base import utcnow
from models.tables import Job, Team
from models.teams import create_team

SPEC = {"base_model": "tiny-llama", "training_file": "file-x", "objective": {"name": "dpo"}}
LEASE = 60.0


@pytest.fixture
def teams(db_sessions):
    with db_sessions() as s:
        ids = {name: create_team(s, name).id for name in ("a", "b", "c")}
        s.commit()
    return ids


def _queue(db_sessions, team_id: str, n: int, **meta: str) -> list[str]:
    out = []
    for _ in range(n):
        with db_sessions() as s:
            out.append(jobs.create_job(s, team_id=team_id, spec=SPEC, metadata=meta).id)
            s.commit()
        time.sleep(0.002)  # distinct created_at: the order within a team is by age
    return out


def _claim(db_sessions, max_running: int = 0, routable=None) -> str | None:
    for _ in range(50):
        with db_sessions() as s:
            try:
                job = scheduling.claim_next(
                    s, scheduling.Claimant("w", LEASE, max_running, routable)
                )
            except scheduling.Contended:
                s.rollback()
                continue
            s.commit()
            return job.id if job is not None else None
    raise AssertionError("still contended after 50 tries")


def _running(db_sessions, team_id: str) -> int:
    with db_sessions() as s:
        return s.execute(
            select(func.count())
            .select_from(Job)
            .where(Job.team_id == team_id, Job.status.in_(("running", "cancelling")))
        ).scalar_one()


def test_the_team_running_fewest_jobs_goes_first(db_sessions, teams):
    a = _queue(db_sessions, teams["a"], 5)
    b = _queue(db_sessions, teams["b"], 1)  # submitted last, behind all of A's
    assert _claim(db_sessions) == a[0]  # nobody runs anything: the oldest job
    assert _claim(db_sessions) == b[0]  # A runs one, B none: B's job jumps A's queue
    assert _claim(db_sessions) == a[1]
    assert _claim(db_sessions) == a[2]


def test_teams_running_as_many_take_turns(db_sessions, teams):
    """Equal running counts (here none: each job ends at once): the team served longest ago
    goes first, so a team with a long backlog does not take every freed slot."""
    a = _queue(db_sessions, teams["a"], 3)
    b = _queue(db_sessions, teams["b"], 3)
    c = _queue(db_sessions, teams["c"], 1)
    order = []
    for _ in range(7):
        job_id = _claim(db_sessions)
        order.append(job_id)
        with db_sessions() as s:  # the slot is free again before the next claim
            assert jobs.finish(s, job_id, "w", "succeeded")
            s.commit()
    assert order == [a[0], b[0], c[0], a[1], b[1], a[2], b[2]]


def test_a_team_at_its_limit_is_skipped_and_nothing_is_claimed_past_it(db_sessions, teams):
    a = _queue(db_sessions, teams["a"], 5)
    assert _claim(db_sessions, max_running=2) == a[0]
    assert _claim(db_sessions, max_running=2) == a[1]
    assert _claim(db_sessions, max_running=2) is None  # A is at 2: the wake-up is dropped
    b = _queue(db_sessions, teams["b"], 1)
    assert _claim(db_sessions, max_running=2) == b[0]
    with db_sessions() as s:  # a cancelling job still holds its worker
        assert jobs.request_cancel(s, a[0]) == "cancelling"
        s.commit()
    assert _claim(db_sessions, max_running=2) is None
    with db_sessions() as s:
        assert jobs.finish(s, a[0], "w", "cancelled")
        assert scheduling.next_queued_of_team(s, teams["a"]) == a[2]  # whom to wake
        s.commit()
    assert _claim(db_sessions, max_running=2) == a[2]
    assert _running(db_sessions, teams["a"]) == 2


def test_only_jobs_the_worker_can_run_are_claimed(db_sessions, teams):
    gpu = _queue(db_sessions, teams["a"], 1, gpus="1")
    cpu = _queue(db_sessions, teams["b"], 1, gpus="0")

    def on_cpu(row) -> bool:
        return row.meta.get("gpus") == "0"

    assert _claim(db_sessions, routable=on_cpu) == cpu[0]
    assert _claim(db_sessions, routable=on_cpu) is None
    assert _claim(db_sessions) == gpu[0]


def test_a_delivery_of_a_dead_workers_job_reclaims_it(db_sessions, teams):
    a = _queue(db_sessions, teams["a"], 2)
    assert _claim(db_sessions, max_running=1) == a[0]
    with db_sessions() as s:
        s.execute(
            update(Job)
            .where(Job.id == a[0])
            .values(lease_expires_at=utcnow() - timedelta(seconds=5))
        )
        s.commit()
    with db_sessions() as s:  # at its limit, but this job already counts for the team
        job = scheduling.claim_for(s, a[0], scheduling.Claimant("w2", LEASE, 1))
        s.commit()
    assert job is not None and job.id == a[0] and job.attempt == 2
    with db_sessions() as s:
        assert s.get(Team, teams["a"]).last_started_at is not None


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
def test_racing_claimers_never_exceed_the_team_limit(db_sessions, teams):
    """12 workers claim at once (barrier) for a team with 10 queued jobs, limit 3: exactly 3
    run, none twice; then B's job is claimed past A's remaining queue."""
    a = _queue(db_sessions, teams["a"], 10)
    racers = 12
    barrier = threading.Barrier(racers)
    got: list[str | None] = [None] * racers

    def race(i: int) -> None:
        barrier.wait()
        got[i] = _claim(db_sessions, max_running=3)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    claimed = [g for g in got if g is not None]
    assert sorted(claimed) == sorted(set(claimed)) and len(claimed) == 3, got
    assert set(claimed) == set(a[:3])
    assert _running(db_sessions, teams["a"]) == 3
    b = _queue(db_sessions, teams["b"], 1)
    assert _claim(db_sessions, max_running=3) == b[0]


def test_the_limit_holds_when_the_candidate_list_is_stale(db_sessions, teams, monkeypatch):
    """The candidates are read without a lock; the claim itself re-counts the team's running
    jobs (a claim that read the list just before another worker's commit must not pass)."""
    a = _queue(db_sessions, teams["a"], 3)
    assert _claim(db_sessions, max_running=1) == a[0]
    unfiltered = scheduling.fair_candidates
    monkeypatch.setattr(
        scheduling, "fair_candidates", lambda s, _limit, **kw: unfiltered(s, 0, **kw)
    )
    with db_sessions() as s, pytest.raises(scheduling.Contended):
        scheduling.claim_next(s, scheduling.Claimant("w", LEASE, 1))
    assert _running(db_sessions, teams["a"]) == 1
