"""Where the API hands committed work: one work-queue object per kind of task, built in
api.main.create_app (app.state.queue for jobs, app.state.eval_queue for evaluations).

    BROKER_URL=memory://   EmbeddedQueue: the in-process worker (worker.embedded)
    otherwise              BackgroundQueue(CeleryQueue): one sender thread sends the Celery
                           task by name (contract.tasks); the API never imports worker code

The DB is the source of truth: a lost message leaves the row `queued`, and the workers' reaper
sends it again (worker.reaper). So enqueue never fails a request (enqueue_after_commit).
"""

from __future__ import annotations

import importlib
import logging
import queue
import threading
from typing import Annotated, Any, Protocol, runtime_checkable

from fastapi import Depends, Request

from contract.tasks import DELIVER_WEBHOOKS, RUN_EVALUATION, RUN_JOB
from models.settings import Settings

log = logging.getLogger("humanline.api")

_CELERY_LOCK = threading.Lock()
# The embedded worker's hand-over function for each task.
_EMBEDDED = {
    RUN_JOB: "enqueue", RUN_EVALUATION: "enqueue_evaluation", DELIVER_WEBHOOKS: "enqueue_webhooks"
}


@runtime_checkable
class WorkQueue(Protocol):
    """Hands a committed row id (a job, an evaluation) to the workers."""

    def enqueue(self, row_id: str) -> None: ...


JobQueue = WorkQueue  # the name the routes and tests know


class CeleryQueue:
    """Sends the Celery task `task(row_id)` by name. Celery is imported on first use only."""

    def __init__(self, broker_url: str, queue: str | None = None, task: str = RUN_JOB):
        self.broker_url = broker_url
        self.queue = queue
        self.task = task
        self._celery: Any = None

    def _app(self) -> Any:
        if self._celery is None:
            # One thread imports: celery's package swaps itself for a lazy module on first
            # import, and a second thread importing meanwhile gets "cannot import name
            # 'Celery'" (seen with the first concurrent POSTs of a fresh process).
            with _CELERY_LOCK:
                if self._celery is None:
                    try:
                        from celery import Celery
                    except ImportError as exc:  # pragma: no cover - depends on the install
                        raise RuntimeError(
                            f"BROKER_URL={self.broker_url!r} needs celery in the API image "
                            "(pip install 'celery[redis]'), or BROKER_URL=memory:// for the "
                            "embedded worker"
                        ) from exc
                    self._celery = Celery("humanline-api", broker=self.broker_url)
        return self._celery

    def enqueue(self, row_id: str) -> None:
        options = {"queue": self.queue} if self.queue else {}
        self._app().send_task(self.task, args=[row_id], **options)


class EmbeddedQueue:
    """BROKER_URL=memory://: hand the id to the in-process worker that `humanline-server
    serve` starts (worker.embedded). Without it the row stays queued, which is visible."""

    def __init__(self, task: str = RUN_JOB):
        self.task = task

    def enqueue(self, row_id: str) -> None:
        try:
            embedded = importlib.import_module("worker.embedded")
        except ImportError as exc:
            raise RuntimeError(
                "BROKER_URL=memory:// runs work in-process, but worker.embedded is not "
                "importable; install the worker extra or point BROKER_URL at a broker"
            ) from exc
        getattr(embedded, _EMBEDDED[self.task])(row_id)


class BackgroundQueue:
    """Hands ids to one sender thread, so a POST does not wait on the broker (a Redis round
    trip plus kombu's framing: a fifth of the route's time). An id still in memory when the
    process dies was committed as `queued`: the workers' sweep sends it again."""

    def __init__(self, inner: WorkQueue):
        self.inner = inner
        self._ids: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def enqueue(self, row_id: str) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    thread = threading.Thread(target=self._send, name="task-sender", daemon=True)
                    thread.start()
                    self._thread = thread
        self._ids.put(row_id)

    def _send(self) -> None:
        while True:
            enqueue_after_commit(self.inner, self._ids.get())


def default_queue(settings: Settings, task: str = RUN_JOB) -> WorkQueue:
    """The work queue of `task` for these settings."""
    if settings.embedded_worker:
        return EmbeddedQueue(task)
    return BackgroundQueue(CeleryQueue(settings.BROKER_URL, settings.CELERY_QUEUE, task))


def enqueue_after_commit(work: WorkQueue, row_id: str) -> None:
    """Never fail a request whose row is already committed: log, the sweep resends."""
    try:
        work.enqueue(row_id)
    except Exception:
        log.exception("could not enqueue; it stays queued", extra={"row_id": row_id})


async def get_queue(request: Request) -> WorkQueue:
    return request.app.state.queue


async def get_eval_queue(request: Request) -> WorkQueue:
    return request.app.state.eval_queue


QueueDep = Annotated[WorkQueue, Depends(get_queue)]
EvalQueueDep = Annotated[WorkQueue, Depends(get_eval_queue)]
