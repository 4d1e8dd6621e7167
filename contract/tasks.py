"""The Celery contract between the API (which sends by name, never importing worker code)
and the workers (which register these names): task names and queue names."""

from __future__ import annotations

RUN_JOB = "worker.tasks.run_job"
RUN_EVALUATION = "worker.tasks.run_evaluation"
REAP = "worker.tasks.reap"
DELIVER_WEBHOOKS = "worker.tasks.deliver_webhooks"  # (endpoint_id): worker.webhooks

CPU_QUEUE = "cpu"
GPU_QUEUE = "gpu"
WORKER_QUEUES = (CPU_QUEUE, GPU_QUEUE)
DEFAULT_INGRESS_QUEUE = "celery"  # Celery's default; CELERY_QUEUE overrides it


def ingress_queue(celery_queue: str | None) -> str:
    """Where the API sends every task (it cannot route without reading the row): the
    CELERY_QUEUE setting, else Celery's default queue."""
    return celery_queue or DEFAULT_INGRESS_QUEUE
