"""Evaluations reach worker.evaluate.run_evaluation: the embedded worker's queue, the Celery
route, and the reaper's re-sends (the evaluation itself is tested in tests/evaluation)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from models.base import utcnow
from models.tables import Evaluation
from tests.worker.conftest import wait_for
from worker import embedded
from worker.reaper import reap_evaluations


def _evaluation(
    local, *, status="queued", age=0.0, lease=None, base_model="tiny-llama", job_id=None
) -> str:
    with local.sessions() as s:
        row = Evaluation(
            team_id=local.team_id,
            base_model=base_model,
            job_id=job_id,
            file_id=None,  # the evaluation fails fast: no file
            kind="math",
            status=status,
            config={},
        )
        s.add(row)
        s.commit()
        s.execute(
            update(Evaluation)
            .where(Evaluation.id == row.id)
            .values(
                updated_at=utcnow() - timedelta(seconds=age),
                lease_owner=None if lease is None else "w",
                lease_expires_at=None if lease is None else utcnow() + timedelta(seconds=lease),
            )
        )
        s.commit()
        return row.id


def _status(local, evaluation_id: str) -> Evaluation:
    with local.sessions() as s:
        return s.get(Evaluation, evaluation_id)


def test_embedded_worker_runs_evaluations(local):
    evaluation_id = _evaluation(local)
    embedded.enqueue_evaluation(evaluation_id)
    embedded.start(local.settings)
    try:
        wait_for(lambda: _status(local, evaluation_id).status == "failed", 30, what="the eval")
    finally:
        embedded.stop()
    assert _status(local, evaluation_id).error["type"] == "missing_file"


def test_stale_evaluations_are_re_sent_once_per_period(local):
    """The reaper's sweep of evaluations, the same as of jobs: a lost message (queued too
    long) and a dead worker (an expired lease) are sent again; fresh and live ones are not."""
    lost = _evaluation(local, age=120)
    dead = _evaluation(local, status="running", lease=-30)
    fresh = _evaluation(local)
    alive = _evaluation(local, status="running", lease=60)
    sent: list[str] = []
    options = {"max_attempts": 5, "stale_queued_seconds": 60}
    assert sorted(reap_evaluations(local.sessions, sent.append, **options)) == sorted([lost, dead])
    assert _status(local, dead).status == "queued"
    assert reap_evaluations(local.sessions, sent.append, **options) == []  # once per period
    assert fresh not in sent and alive not in sent


def test_evaluations_are_routed_like_their_model(local):
    from worker.celery_app import evaluation_queue

    job_id = local.make_job(max_steps=1)
    assert evaluation_queue(local.sessions, _evaluation(local)) == "cpu"
    assert evaluation_queue(local.sessions, _evaluation(local, base_model="smollm2-135m")) == "gpu"
    by_job = _evaluation(local, base_model=None, job_id=job_id)  # tiny-llama's job
    assert evaluation_queue(local.sessions, by_job) == "cpu"
    assert evaluation_queue(local.sessions, "eval-missing") is None
