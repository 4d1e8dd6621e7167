"""The reaper: finds jobs whose worker died and jobs whose task message was lost, and sends
their task again. Run it often; it is a few guarded UPDATEs and safe to run anywhere, any
number of times at once (every worker process runs one, see worker.celery_app).

    running/cancelling, lease expired  → models.jobs.reap_expired: queued (sent again here),
                                          cancelled (it was being cancelled), or failed after
                                          MAX_JOB_ATTEMPTS lost workers
    queued, untouched for STALE_QUEUED_SECONDS
                                       → sent again (the API's send may have been lost
                                          between its commit and the broker)

Why a thread in every worker process rather than Celery beat: beat must run as exactly one
extra process, and a deployment that forgets it (or loses its machine) silently stops
recovering jobs. The sweep is idempotent, so N workers running it is fine: the UPDATEs are
guarded (only one sweeper moves a job) and a duplicate task is harmless (claim() lets one
attempt win). `worker.tasks.reap` exists for operators who prefer beat as well.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from models import jobs as job_states
from models.base import utcnow
from models.db import session_scope
from models.tables import Job

log = logging.getLogger("humanline.worker.reaper")


def take_stale_queued(sessions: sessionmaker[Session], older_than_seconds: float) -> list[str]:
    """Queued jobs untouched for `older_than_seconds`, each taken by one sweeper: touching
    updated_at with a guarded UPDATE means concurrent sweeps do not all re-send the same job,
    and a job waiting behind a long backlog is re-sent at most once per period."""
    now = utcnow()
    cutoff = now - timedelta(seconds=older_than_seconds)
    taken: list[str] = []
    with session_scope(sessions) as s:
        for job_id in job_states.stale_queued(s, older_than_seconds, now=now):
            won = s.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == "queued", Job.updated_at < cutoff)
                .values(updated_at=now)
                .execution_options(synchronize_session=False)
            ).rowcount
            if won:
                taken.append(job_id)
    return taken


def reap_and_requeue(
    sessions: sessionmaker[Session],
    send: Callable[[str], None],
    *,
    max_attempts: int | None,
    stale_queued_seconds: float | None,
) -> list[str]:
    """One sweep. Commits the state changes, then sends run_job for each job to run again
    (after the commit: the worker must see it queued). Returns the ids sent."""
    with session_scope(sessions) as s:
        requeued = job_states.reap_expired(s, max_attempts=max_attempts)
    stale = take_stale_queued(sessions, stale_queued_seconds) if stale_queued_seconds else []
    sent = []
    for job_id in requeued + stale:
        try:
            send(job_id)
            sent.append(job_id)
        except Exception:  # the job stays queued: the stale sweep sends it again later
            log.exception("could not send job %s", job_id)
    if requeued:
        log.warning("requeued jobs whose worker was lost: %s", ", ".join(requeued))
    if stale:
        log.warning("re-sent jobs queued for too long: %s", ", ".join(stale))
    return sent


class EvaluationSweep:
    """Evaluations whose message was lost (queued too long) or whose worker died (running
    without a heartbeat for `running_seconds`): sent again (worker.evaluate.claim lets one
    delivery win). Their rows carry no lease columns to take, so each process remembers what
    it sent and re-sends an evaluation at most once per `queued_seconds`."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        send: Callable[[str], None],
        *,
        queued_seconds: float,
        running_seconds: float,
    ):
        self.sessions = sessions
        self.send = send
        self.queued_seconds = queued_seconds
        self.running_seconds = running_seconds
        self.sent_at: dict[str, float] = {}

    def __call__(self) -> list[str]:
        from worker.evaluate import stale_evaluations

        now = time.monotonic()
        stale = stale_evaluations(
            self.sessions,
            queued_seconds=self.queued_seconds,
            running_seconds=self.running_seconds,
        )
        self.sent_at = {k: t for k, t in self.sent_at.items() if k in stale}
        sent = []
        for evaluation_id in stale:
            last = self.sent_at.get(evaluation_id)
            if last is not None and now - last < self.queued_seconds:
                continue
            try:
                self.send(evaluation_id)
            except Exception:
                log.exception("could not send evaluation %s", evaluation_id)
                continue
            self.sent_at[evaluation_id] = now
            sent.append(evaluation_id)
        if sent:
            log.warning("re-sent stale evaluations: %s", ", ".join(sent))
        return sent


class ReaperThread(threading.Thread):
    """Calls `sweep` every `interval` seconds (and once at start) until stop()."""

    def __init__(self, sweep: Callable[[], object], interval: float):
        super().__init__(name="humanline-reaper", daemon=True)
        self.sweep = sweep
        self.interval = interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        while True:
            try:
                self.sweep()
            except Exception:  # the DB or broker blinked: try again next period
                log.exception("reaper sweep failed")
            if self._stop_event.wait(self.interval):
                return

    def stop(self, timeout: float = 10.0) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
