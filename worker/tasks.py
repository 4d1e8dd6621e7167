"""Celery tasks. Thin: the work is worker.runner.Runner (shared with the embedded worker).

`celery -A worker.tasks worker` works too (the app is re-exported here).
"""

from __future__ import annotations

import logging
from functools import lru_cache

from celery.worker import state as worker_state

from models.db import make_engine, make_session_factory
from storage import open_store
from worker.celery_app import (
    RUN_EVALUATION,
    RUN_JOB,
    app,
    evaluation_queue,
    job_queue,
    send_run_evaluation,
    send_run_job,
    settings,
)
from worker.reaper import reap_and_requeue
from worker.runner import Runner

__all__ = ["app", "reap", "run_evaluation", "run_job"]

log = logging.getLogger("humanline.worker")


def _stopping() -> bool:
    """A warm shutdown (SIGTERM) was requested: checkpoint, give the job back, exit.
    (Celery sets the flags to an exit code, 0 included: compare by identity, as it does.)"""
    flags = (worker_state.should_stop, worker_state.should_terminate)
    return any(flag is not None and flag is not False for flag in flags)


@lru_cache
def runner() -> Runner:
    """One per worker process, made on first use (after a prefork child has forked)."""
    sessions = make_session_factory(make_engine(settings.DATABASE_URL))
    store = open_store(settings.STORAGE_URL, **settings.storage_options())
    return Runner(
        settings,
        sessions,
        store,
        send=lambda job_id: send_run_job(sessions, job_id),
        send_evaluation=lambda evaluation_id: send_run_evaluation(sessions, evaluation_id),
        should_stop=_stopping,
    )


@app.task(name=RUN_JOB, bind=True)
def run_job(self, job_id: str) -> str | None:
    """Run one job; safe to deliver twice. Forwarded once if it arrived on another queue
    than the job's own (the API sends everything to the ingress queue)."""
    r = runner()
    delivered_on = (self.request.delivery_info or {}).get("routing_key")
    target = job_queue(r.sessions, job_id)
    if target is None:
        log.warning("run_job: no job %s", job_id)
        return None
    if delivered_on and delivered_on != target:
        app.send_task(RUN_JOB, args=[job_id], queue=target)
        log.info("job %s forwarded from queue %s to %s", job_id, delivered_on, target)
        return f"forwarded:{target}"
    return r.run(job_id)


@app.task(name=RUN_EVALUATION, bind=True)
def run_evaluation(self, evaluation_id: str) -> str | None:
    """Run one evaluation (worker.evaluate); safe to deliver twice; forwarded like run_job."""
    from worker import evaluate

    r = runner()
    delivered_on = (self.request.delivery_info or {}).get("routing_key")
    target = evaluation_queue(r.sessions, evaluation_id)
    if target is None:
        log.warning("run_evaluation: no evaluation %s", evaluation_id)
        return None
    if delivered_on and delivered_on != target:
        app.send_task(RUN_EVALUATION, args=[evaluation_id], queue=target)
        log.info("evaluation %s forwarded from queue %s to %s", evaluation_id, delivered_on, target)
        return f"forwarded:{target}"
    return evaluate.run_evaluation(evaluation_id, r.sessions, r.store, settings)


@app.task(name="worker.tasks.reap")
def reap() -> list[str]:
    """The reaper sweep as a task, for a Celery beat schedule (the worker threads do the
    same without beat)."""
    r = runner()
    return reap_and_requeue(
        r.sessions,
        lambda job_id: send_run_job(r.sessions, job_id),
        max_attempts=settings.MAX_JOB_ATTEMPTS,
        stale_queued_seconds=settings.STALE_QUEUED_SECONDS,
    )
