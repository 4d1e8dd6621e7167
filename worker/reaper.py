"""The reaper: finds work whose worker died and work whose task message was lost, and sends
its task again. Run it often; it is a few guarded UPDATEs and safe to run anywhere, any
number of times at once (every worker process runs one, see worker.celery_app). One shape
for jobs and evaluations (models.leases):

    running/cancelling, lease expired  → reap_expired (models.jobs, models.evaluations):
                                          queued (sent again here), cancelled (a job being
                                          cancelled), or failed after MAX_JOB_ATTEMPTS
    queued, untouched for STALE_QUEUED_SECONDS
                                       → sent again (the API's send may have been lost
                                          between its commit and the broker)

Why a thread in every worker process rather than Celery beat: beat must run as exactly one
extra process, and a deployment that forgets it (or loses its machine) silently stops
recovering work. The sweep is idempotent, so N workers running it is fine: the UPDATEs are
guarded (only one sweeper moves a row) and a duplicate task is harmless (a claim lets one
attempt win). `worker.tasks.reap` exists for operators who prefer beat as well.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from models import evaluations as eval_states
from models import jobs as job_states
from models import leases
from models.db import session_scope
from models.tables import Evaluation, Job

if TYPE_CHECKING:
    from worker.config import WorkerSettings

log = logging.getLogger("humanline.worker.reaper")
Send = Callable[[str], None]


@dataclass(frozen=True)
class Leased:
    """A table of leased work and its reap (models.jobs / models.evaluations)."""

    name: str
    table: Any
    reap_expired: Callable[..., list[str]]


JOBS = Leased("job", Job, job_states.reap_expired)
EVALUATIONS = Leased("evaluation", Evaluation, eval_states.reap_expired)


def sweep(
    kind: Leased,
    sessions: sessionmaker[Session],
    send: Callable[[str], None],
    *,
    max_attempts: int | None,
    stale_queued_seconds: float | None,
) -> list[str]:
    """One sweep of one table. Commits the state changes, then sends the task of each row to
    run again (after the commit: the worker must see it queued). Returns the ids sent."""
    with session_scope(sessions) as s:
        requeued = kind.reap_expired(s, max_attempts=max_attempts)
    stale: list[str] = []
    if stale_queued_seconds:
        with session_scope(sessions) as s:
            stale = leases.take_stale_queued(s, kind.table, stale_queued_seconds)
    sent = []
    for row_id in requeued + stale:
        try:
            send(row_id)
            sent.append(row_id)
        except Exception:  # it stays queued: the stale sweep sends it again later
            log.exception("could not send %s %s", kind.name, row_id)
    if requeued:
        log.warning("requeued %ss whose worker was lost: %s", kind.name, ", ".join(requeued))
    if stale:
        log.warning("re-sent %ss queued for too long: %s", kind.name, ", ".join(stale))
    return sent


def reaper_options(
    settings: WorkerSettings, *, stale_queued_seconds: float | None = None
) -> dict[str, Any]:
    """The options of a sweep (reap_and_requeue, reap_evaluations) from the settings:
    MAX_JOB_ATTEMPTS and STALE_QUEUED_SECONDS, or `stale_queued_seconds` in its place (the
    embedded worker's first sweep re-sends everything queued)."""
    stale = settings.STALE_QUEUED_SECONDS if stale_queued_seconds is None else stale_queued_seconds
    return {"max_attempts": settings.MAX_JOB_ATTEMPTS, "stale_queued_seconds": stale}


def reap_and_requeue(sessions: sessionmaker[Session], send: Send, **options: Any) -> list[str]:
    """One sweep of the jobs (max_attempts=, stale_queued_seconds=)."""
    return sweep(JOBS, sessions, send, **options)


def reap_evaluations(sessions: sessionmaker[Session], send: Send, **options: Any) -> list[str]:
    """One sweep of the evaluations."""
    return sweep(EVALUATIONS, sessions, send, **options)


def take_stale_queued(sessions: sessionmaker[Session], older_than_seconds: float) -> list[str]:
    """Queued jobs untouched for `older_than_seconds`, each taken by one sweeper."""
    with session_scope(sessions) as s:
        return leases.take_stale_queued(s, Job, older_than_seconds)


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
