"""An evaluation's lease (models.evaluations on models.leases), on SQLite and PostgreSQL:
claims, the fence that stops a zombie attempt, and the reaper's requeue."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from models import evaluations as ev
from models import leases
from models.base import utcnow
from models.tables import Evaluation
from models.teams import create_team


@pytest.fixture
def new_eval(db_sessions):
    with db_sessions() as s:
        team = create_team(s, "e")
        s.commit()
        team_id = team.id

    def make(**values) -> str:
        with db_sessions() as s:
            row = Evaluation(team_id=team_id, base_model="tiny-llama", kind="math", **values)
            s.add(row)
            s.commit()
            return row.id

    return make


def _set(db_sessions, eid: str, **values) -> None:
    with db_sessions() as s:
        s.execute(update(Evaluation).where(Evaluation.id == eid).values(**values))
        s.commit()


def _expire_lease(db_sessions, eid: str) -> None:
    _set(db_sessions, eid, lease_expires_at=utcnow() - timedelta(seconds=1))


def test_claim_takes_queued_and_expired_rows_only(db_sessions, new_eval):
    queued, dead, done = new_eval(), new_eval(), new_eval(status="succeeded")
    with db_sessions() as s:
        row = ev.claim(s, queued, "w1", 60)
        s.commit()
        assert row is not None and row.status == "running" and row.attempt == 1
        assert row.lease_owner == "w1" and row.lease_expires_at > utcnow()
        assert ev.claim(s, queued, "w2", 60) is None  # leased by a live worker
        assert ev.claim(s, done, "w2", 60) is None
        assert ev.claim(s, dead, "w-dead", 60) is not None
        s.commit()
    _expire_lease(db_sessions, dead)  # its worker died
    with db_sessions() as s:
        again = ev.claim(s, dead, "w3", 60)
        s.commit()
        assert again is not None and again.attempt == 2 and again.lease_owner == "w3"


def test_the_fence_stops_a_zombie_attempt(db_sessions, new_eval):
    eid = new_eval()
    with db_sessions() as s:
        assert ev.claim(s, eid, "first", 60) is not None
        assert ev.heartbeat(s, eid, "first", 60, progress={"done": 1}) == "running"
        s.commit()
        assert s.get(Evaluation, eid).result == {"progress": {"done": 1}}
    _expire_lease(db_sessions, eid)
    with db_sessions() as s:  # another worker reclaims it
        assert ev.claim(s, eid, "second", 60) is not None
        s.commit()
    with db_sessions() as s:
        assert ev.heartbeat(s, eid, "first", 60) is None  # the zombie learns it lost
        assert not ev.finish(s, eid, "first", "succeeded", result={"x": 1})
        assert ev.finish(s, eid, "second", "failed", error={"type": "x", "message": "y"})
        s.commit()
        row = s.get(Evaluation, eid)
        assert row.status == "failed" and row.lease_owner is None and row.finished_at is not None
        assert ev.heartbeat(s, eid, "second", 60) is None  # finished: nothing to renew


def test_reap_requeues_an_expired_lease_then_gives_up(db_sessions, new_eval):
    eid, alive = new_eval(), new_eval()
    with db_sessions() as s:
        ev.claim(s, eid, "w1", 60)
        ev.claim(s, alive, "w2", 60)
        s.commit()
    _expire_lease(db_sessions, eid)
    with db_sessions() as s:
        assert ev.reap_expired(s, max_attempts=2) == [eid]  # the live lease is left alone
        s.commit()
        assert s.get(Evaluation, eid).status == "queued"
        assert s.get(Evaluation, alive).status == "running"
        ev.claim(s, eid, "w3", 60)  # attempt 2
        s.commit()
    _expire_lease(db_sessions, eid)
    with db_sessions() as s:
        assert ev.reap_expired(s, max_attempts=2) == []
        s.commit()
        row = s.get(Evaluation, eid)
        assert row.status == "failed" and row.error["type"] == "worker_lost"


def test_stale_queued_rows_are_taken_once_per_period(db_sessions, new_eval):
    old, fresh = new_eval(), new_eval()
    _set(db_sessions, old, updated_at=utcnow() - timedelta(seconds=120))
    with db_sessions() as s:
        assert leases.take_stale_queued(s, Evaluation, 60) == [old]
        s.commit()
        assert leases.take_stale_queued(s, Evaluation, 60) == []  # touched: not again yet
        assert fresh not in leases.stale_queued(s, Evaluation, 60)
