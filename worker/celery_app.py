"""The Celery application of the workers.

    celery -A worker.celery_app worker -Q celery,cpu,gpu --pool=solo -c 1     # one job at a time

Settings (environment, see worker.config.WorkerSettings): BROKER_URL (redis:// or amqp://),
DATABASE_URL, STORAGE_URL (+ S3_*/AWS_*), LEASE_SECONDS, HEARTBEAT_SECONDS, REAPER_SECONDS,
STALE_QUEUED_SECONDS, WORKER_DIR, WORKER_GPUS, WORKER_CPU_MODELS, SWEEP_SECONDS,
SWEEP_GRACE_SECONDS.

The storage sweep (worker.sweeper) runs from Celery beat, one process per deployment:

    celery -A worker.celery_app beat          # sends worker.tasks.sweep_storage every SWEEP_SECONDS
                                              # and worker.tasks.reconcile_jobs every
                                              # RECONCILE_SECONDS (multi-node jobs: required)

Queues:
  * `cpu`, `gpu`: where jobs run; worker.routing.queue_for decides per job (metadata `gpus`,
    else the base model). A GPU machine consumes `gpu`, a CPU machine `cpu`.
  * the ingress queue: CELERY_QUEUE, or Celery's default `celery`. The API sends every
    run_job there, because it cannot route without reading the job (and it never imports
    worker code). A worker that receives a job on a queue other than the job's own forwards
    it there (one hop; the route of a job never changes, so it cannot bounce). So at least
    one kind of worker must consume the ingress queue (the command above consumes all three;
    a worker started without -Q consumes every queue declared here).
  * The reaper sends straight to the job's own queue.

Reliability: acks_late + prefetch 1 + reject_on_worker_lost: a message is acknowledged when
the task returns, and a worker that dies loses nothing the broker had. The DB decides who
runs a job (claim), so redeliveries (Redis visibility timeout, a killed worker) are no-ops
while the job's lease is valid; a dead worker's job is requeued by the reaper once its lease
has expired. A jobs may be longer than the Redis visibility timeout (1 h): the redelivered
copy finds the job leased and returns.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, signals
from kombu import Exchange, Queue

from contract.tasks import (
    CPU_QUEUE,
    DELIVER_WEBHOOKS,
    GPU_QUEUE,
    RUN_EVALUATION,
    RUN_JOB,
    ingress_queue,
)
from models.db import make_engine, make_session_factory
from models.tables import Evaluation, Job
from worker.config import get_worker_settings
from worker.reaper import ReaperThread, reap_and_requeue, reap_evaluations, reaper_options
from worker.routing import queue_for
from worker.webhooks import due_endpoints

log = logging.getLogger("humanline.worker")

settings = get_worker_settings()
INGRESS_QUEUE = ingress_queue(settings.CELERY_QUEUE)
QUEUE_NAMES = tuple(dict.fromkeys((INGRESS_QUEUE, CPU_QUEUE, GPU_QUEUE)))

app = Celery("humanline", broker=settings.BROKER_URL, include=["worker.tasks"])
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_reject_on_worker_lost=True,
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    task_ignore_result=True,
    # Each queue on its own direct exchange with its own name as routing key: what Celery
    # makes for a queue it was not told about (the API's send_task(queue=...)), and what
    # makes delivery_info["routing_key"] name the queue a message came from. (A bare
    # Queue(name) here would bind all three to the default exchange under one key, and
    # every message would land in all of them.)
    task_queues=[
        Queue(name, Exchange(name, type="direct"), routing_key=name) for name in QUEUE_NAMES
    ],
    task_default_queue=INGRESS_QUEUE,
    broker_connection_retry_on_startup=True,
    worker_send_task_events=False,
    task_send_sent_event=False,
)


SWEEP_STORAGE = "worker.tasks.sweep_storage"
RECONCILE_JOBS = "worker.tasks.reconcile_jobs"
RECONCILE_SECONDS = settings.RECONCILE_SECONDS
app.conf.beat_schedule = {
    # multi-node jobs (worker.reconcile): a no-op query when there are none
    "reconcile-jobs": {
        "task": RECONCILE_JOBS,
        "schedule": RECONCILE_SECONDS,
        "options": {"queue": INGRESS_QUEUE, "expires": RECONCILE_SECONDS},
    }
}
if settings.SWEEP_SECONDS > 0:
    app.conf.beat_schedule["sweep-storage"] = {
        "task": SWEEP_STORAGE,
        "schedule": settings.SWEEP_SECONDS,
        # a sweep nobody took before the next one is due is not worth running
        "options": {"queue": INGRESS_QUEUE, "expires": settings.SWEEP_SECONDS},
    }


def job_queue(sessions, job_id: str) -> str | None:
    """The queue `job_id` belongs on (None: no such job)."""
    with sessions() as s:
        row = s.get(Job, job_id)
        if row is None:
            return None
        return queue_for(row.base_model, row.meta, settings.cpu_models)


def send_run_job(sessions, job_id: str) -> None:
    """run_job(job_id) on the job's own queue."""
    queue = job_queue(sessions, job_id) or INGRESS_QUEUE
    app.send_task(RUN_JOB, args=[job_id], queue=queue)


def evaluation_queue(sessions, evaluation_id: str) -> str | None:
    """An evaluation goes where its model would train: routed by its base model, or by its
    job's (None: no such evaluation)."""
    with sessions() as s:
        row = s.get(Evaluation, evaluation_id)
        if row is None:
            return None
        base_model = row.base_model
        if base_model is None and row.job_id is not None:
            job = s.get(Job, row.job_id)
            base_model = job.base_model if job is not None else None
        return queue_for(base_model or "", {}, settings.cpu_models)


def send_run_evaluation(sessions, evaluation_id: str) -> None:
    queue = evaluation_queue(sessions, evaluation_id) or INGRESS_QUEUE
    app.send_task(RUN_EVALUATION, args=[evaluation_id], queue=queue)


# --- the reaper thread of every worker process ----------------------------------------------


def sweep(sessions) -> list[str]:
    """One reaper sweep of jobs and evaluations, sending to their own queues."""
    options = reaper_options(settings)
    for endpoint_id in due_endpoints(sessions):  # webhook deliveries nobody is sending
        app.send_task(DELIVER_WEBHOOKS, args=[endpoint_id])
    return reap_and_requeue(
        sessions, lambda job_id: send_run_job(sessions, job_id), **options
    ) + reap_evaluations(sessions, lambda eid: send_run_evaluation(sessions, eid), **options)


_reaper: dict[str, Any] = {}


@signals.worker_ready.connect
def _start_reaper(**_: Any) -> None:
    """Runs in the worker's main process once it consumes (solo and prefork alike)."""
    sessions = make_session_factory(make_engine(settings.DATABASE_URL))
    thread = ReaperThread(lambda: sweep(sessions), settings.REAPER_SECONDS)
    thread.start()
    _reaper["thread"] = thread
    log.info("reaper running every %.1fs", settings.REAPER_SECONDS)


@signals.worker_shutdown.connect
def _stop_reaper(**_: Any) -> None:
    thread = _reaper.pop("thread", None)
    if thread is not None:
        thread.stop()
