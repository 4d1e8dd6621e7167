"""Celery tasks. Thin: the work is worker.runner.Runner (shared with the embedded worker).

`celery -A worker.tasks worker` works too (the app is re-exported here).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from celery.worker import state as worker_state

from contract.tasks import DELIVER_WEBHOOKS, REAP
from models import webhooks as webhook_outbox
from models.db import make_engine, make_session_factory
from storage import open_store
from worker.celery_app import (
    RECONCILE_JOBS,
    RUN_EVALUATION,
    RUN_JOB,
    SWEEP_STORAGE,
    app,
    evaluation_queue,
    job_queue,
    send_run_evaluation,
    send_run_job,
    settings,
    sweep,
)
from worker.runner import Runner
from worker.sweeper import sweep as sweep_store
from worker.webhooks import deliver_endpoint

__all__ = [
    "app",
    "deliver_webhooks",
    "reap",
    "reconcile_jobs",
    "run_evaluation",
    "run_job",
    "sweep_storage",
]

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


def _run_here_or_forward(
    task: Any, name: str, kind: str, row_id: str, target: str | None, run: Callable[[str], Any]
) -> str | None:
    """Run `row_id` if it arrived on its own queue, else forward it there once (the API
    sends everything to the ingress queue; a row's route never changes, so it cannot bounce)."""
    delivered_on = (task.request.delivery_info or {}).get("routing_key")
    if target is None:
        log.warning("%s: no %s %s", name, kind, row_id)
        return None
    if delivered_on and delivered_on != target:
        app.send_task(name, args=[row_id], queue=target)
        log.info("%s %s forwarded from queue %s to %s", kind, row_id, delivered_on, target)
        return f"forwarded:{target}"
    return run(row_id)


@app.task(name=RUN_JOB, bind=True)
def run_job(self, job_id: str) -> str | None:
    """A wake-up for this worker: run the fairest claimable job of the queue `job_id` is
    routed to (models.scheduling; the job itself when its worker died). Returns at once when
    nothing is claimable (the team at its limit, the job taken): never holds the slot."""
    r = runner()
    target = job_queue(r.sessions, job_id)
    return _run_here_or_forward(
        self, RUN_JOB, "job", job_id, target, lambda row_id: r.run(row_id, queue=target)
    )


@app.task(name=RUN_EVALUATION, bind=True)
def run_evaluation(self, evaluation_id: str) -> str | None:
    """Run one evaluation (worker.evaluate); safe to deliver twice."""
    r = runner()
    target = evaluation_queue(r.sessions, evaluation_id)
    return _run_here_or_forward(
        self, RUN_EVALUATION, "evaluation", evaluation_id, target, r.evaluate
    )


@app.task(name=REAP)
def reap() -> list[str]:
    """The reaper sweep as a task, for a Celery beat schedule (the worker threads do the
    same without beat)."""
    return sweep(runner().sessions)


@app.task(name=SWEEP_STORAGE)
def sweep_storage() -> dict[str, Any]:
    """One storage sweep (worker.sweeper), sent by Celery beat every SWEEP_SECONDS; returns
    what it removed per kind."""
    r = runner()
    report = sweep_store(r.sessions, r.store, grace_seconds=settings.SWEEP_GRACE_SECONDS)
    return report.as_dict()


@app.task(name=RECONCILE_JOBS)
def reconcile_jobs() -> dict[str, str]:
    """One reconcile of every launched multi-node job (worker.reconcile), sent by Celery beat
    every RECONCILE_SECONDS; returns {job id: outcome}."""
    return runner().reconciler().run_once()


def send_deliver_webhooks(endpoint_id: str, countdown: float | None = None) -> None:
    app.send_task(DELIVER_WEBHOOKS, args=[endpoint_id], countdown=countdown)


# The outbox rows this process commits (a job's end) start their deliveries at once.
webhook_outbox.set_sender(send_deliver_webhooks)


@app.task(name=DELIVER_WEBHOOKS)
def deliver_webhooks(endpoint_id: str) -> float | None:
    """Send an endpoint's due webhook deliveries in order (worker.webhooks); when a retry is
    pending, run again once it is due (exponential backoff, WEBHOOK_BACKOFF_SECONDS)."""
    delay = deliver_endpoint(runner().sessions, settings, endpoint_id)
    if delay is not None:
        send_deliver_webhooks(endpoint_id, countdown=delay)
    return delay
