"""The embedded worker's webhook sender (docs/webhooks.md): a dispatcher thread and a pool of
WEBHOOK_SENDERS threads, so that one slow receiver delays no other endpoint.

Each endpoint is sent by one pool thread at a time (its deliveries stay in order; a wake-up
meanwhile runs it again once that one is done); a team's endpoints take at most
WEBHOOK_SENDERS_PER_TEAM of the pool's threads (worker.webhooks' claim, the same bound the
Celery workers share), and each attempt ends by its deadline (worker.webhook_http). The
dispatcher is woken by `wake(endpoint_id)` after a commit, by the retries it schedules, and
every `poll` seconds for whatever is due (the reaper's role in the embedded server).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.orm import Session, sessionmaker

from models.settings import Settings
from worker.webhooks import deliver_endpoint, due_endpoints

log = logging.getLogger("humanline.worker.webhooks")


class WebhookThread(threading.Thread):
    def __init__(self, sessions: sessionmaker[Session], settings: Settings, poll: float = 5.0):
        super().__init__(name="humanline-webhooks", daemon=True)
        self.sessions, self.settings, self.poll = sessions, settings, poll
        self._wakeups: queue.Queue[str | None] = queue.Queue()
        self._retries: dict[str, float] = {}  # endpoint → monotonic time its retry is due
        self._lock = threading.Lock()
        self._running: set[str] = set()  # endpoints a pool thread is sending
        self._again: set[str] = set()  # woken while running: run once more after
        self._halt = threading.Event()
        self._pool = ThreadPoolExecutor(
            max_workers=settings.WEBHOOK_SENDERS, thread_name_prefix="humanline-webhook-send"
        )

    def wake(self, endpoint_id: str) -> None:
        self._wakeups.put(endpoint_id)

    def _due(self) -> set[str]:
        now = time.monotonic()
        with self._lock:
            due = {e for e, at in self._retries.items() if at <= now}
            for endpoint_id in due:
                del self._retries[endpoint_id]
        return due

    def run(self) -> None:
        last_poll = 0.0
        while not self._halt.is_set():
            with self._lock:
                soonest = [at - time.monotonic() for at in self._retries.values()]
            try:
                first = self._wakeups.get(timeout=max(min([self.poll, *soonest]), 0.01))
                todo = {first} if first else set()
            except queue.Empty:
                todo = set()
            todo |= self._due()
            if time.monotonic() - last_poll >= self.poll:
                last_poll = time.monotonic()
                try:
                    todo |= set(due_endpoints(self.sessions))
                except Exception:
                    log.exception("webhook poll failed")
            for endpoint_id in sorted(todo):
                self._start(endpoint_id)

    def _start(self, endpoint_id: str) -> None:
        with self._lock:
            if endpoint_id in self._running:
                self._again.add(endpoint_id)
                return
            self._running.add(endpoint_id)
        try:
            self._pool.submit(self._send, endpoint_id)
        except RuntimeError:  # the pool is shut down: stopping
            with self._lock:
                self._running.discard(endpoint_id)

    def _send(self, endpoint_id: str) -> None:
        try:
            delay = deliver_endpoint(self.sessions, self.settings, endpoint_id)
        except Exception:
            log.exception("webhook %s: delivery failed", endpoint_id)
            delay = self.poll
        with self._lock:
            self._running.discard(endpoint_id)
            again = endpoint_id in self._again
            self._again.discard(endpoint_id)
            if delay is not None:
                self._retries[endpoint_id] = time.monotonic() + delay
        if again:
            self.wake(endpoint_id)
        elif delay is not None:
            self._wakeups.put("")  # the dispatcher's next wait must see the new retry

    def stop(self, timeout: float = 10.0) -> None:
        self._halt.set()
        self._wakeups.put(None)
        self.join(timeout)
        self._pool.shutdown(wait=True, cancel_futures=True)  # an attempt ends by its deadline
