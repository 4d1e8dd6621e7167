"""The embedded worker (BROKER_URL=memory://): jobs run in a background thread of the API
process, with the same Runner as the Celery workers, plus the reaper and the storage sweeper
(worker.sweeper, every SWEEP_SECONDS). No broker, no
external services: SQLite and a local object store are enough.

    handle = worker.embedded.start(settings)   # api.cli serve does this
    worker.embedded.enqueue(job_id)            # api.queues.EmbeddedQueue, after the commit
    worker.embedded.enqueue_evaluation(eid)    # the same, for evaluations
    handle.stop()                              # asks a running trainer to checkpoint; the
                                               # job goes back to `queued`

Jobs and evaluations run one at a time, in order. Ids enqueued before start() wait for it. At
start the reaper also re-sends every queued job and evaluation at once (a restarted server picks
its queue up again); one left `running` by a process that died is requeued when its lease
expires.
"""

from __future__ import annotations

import logging
import queue
import threading

from models import webhooks as webhook_outbox
from models.db import make_engine, make_session_factory
from models.settings import Settings
from storage import open_store
from worker.config import WorkerSettings, as_worker_settings
from worker.reaper import ReaperThread, reap_and_requeue, reap_evaluations, reaper_options
from worker.runner import Runner
from worker.sweeper import StoreSweeper
from worker.webhook_thread import WebhookThread

log = logging.getLogger("humanline.worker.embedded")

_jobs: queue.Queue[tuple[str, str] | None] = queue.Queue()  # ("job" | "evaluation", id)
_lock = threading.Lock()
_current: EmbeddedWorker | None = None


def enqueue(job_id: str) -> None:
    """Hand a committed job to the in-process worker (it runs once start() was called)."""
    _jobs.put(("job", job_id))


def enqueue_evaluation(evaluation_id: str) -> None:
    """Hand a committed evaluation to the in-process worker."""
    _jobs.put(("evaluation", evaluation_id))


def enqueue_webhooks(endpoint_id: str) -> None:
    """Wake the webhook thread for an endpoint with new deliveries (its poll finds them
    anyway)."""
    current = _current
    if current is not None:
        current.webhooks.wake(endpoint_id)


class EmbeddedWorker:
    def __init__(self, settings: WorkerSettings):
        self.settings = settings
        self.sessions = make_session_factory(make_engine(settings.DATABASE_URL))
        self.store = open_store(settings.STORAGE_URL, **settings.storage_options())
        self._stopping = threading.Event()
        self.runner = Runner(
            settings,
            self.sessions,
            self.store,
            send=enqueue,
            send_evaluation=enqueue_evaluation,
            should_stop=self._stopping.is_set,
        )
        self.thread = threading.Thread(target=self._loop, name="humanline-embedded", daemon=True)
        self.webhooks = WebhookThread(self.sessions, settings)  # never behind a training job
        self._first_sweep = True
        self.reaper = ReaperThread(self._sweep, settings.REAPER_SECONDS)
        self.sweeper: ReaperThread | None = None
        if settings.SWEEP_SECONDS > 0:
            sweep = StoreSweeper(self.sessions, self.store, settings.SWEEP_GRACE_SECONDS)
            self.sweeper = ReaperThread(sweep, settings.SWEEP_SECONDS)
            self.sweeper.name = "humanline-sweeper"

    def _sweep(self) -> list[str]:
        # First sweep: everything queued is ours to (re)start; later ones only the stale.
        first, self._first_sweep = self._first_sweep, False
        options = reaper_options(self.settings, stale_queued_seconds=1e-6 if first else None)
        return reap_and_requeue(self.sessions, enqueue, **options) + reap_evaluations(
            self.sessions, enqueue_evaluation, **options
        )

    def _loop(self) -> None:
        while not self._stopping.is_set():
            item = _jobs.get()
            if item is None:  # stop()'s wake-up (or a stale one from an earlier worker)
                continue
            if self._stopping.is_set():
                _jobs.put(item)  # keep it for a later start()
                break
            kind, item_id = item
            try:
                if kind == "evaluation":
                    outcome = self.runner.evaluate(item_id)
                else:
                    outcome = self.runner.run(item_id)
                log.info("%s %s: %s", kind, item_id, outcome)
            except Exception:
                log.exception("%s %s: the embedded worker failed", kind, item_id)

    def start(self) -> EmbeddedWorker:
        self.thread.start()
        self.webhooks.start()
        webhook_outbox.set_sender(self.webhooks.wake)
        self.reaper.start()
        if self.sweeper is not None:
            self.sweeper.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Stop taking jobs; a running job checkpoints at its next step and is released."""
        self._stopping.set()
        webhook_outbox.set_sender(None)
        self.webhooks.stop()
        self.reaper.stop()
        if self.sweeper is not None:
            self.sweeper.stop()
        _jobs.put(None)  # wakes the loop if it is idle
        self.thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()


def start(settings: Settings) -> EmbeddedWorker:
    """Start the in-process worker (once per process; later calls return the same one)."""
    global _current
    with _lock:
        if _current is not None and _current.alive:
            return _current
        _current = EmbeddedWorker(as_worker_settings(settings)).start()
        return _current


def stop(timeout: float = 60.0) -> None:
    global _current
    with _lock:
        if _current is not None:
            _current.stop(timeout)
            _current = None
