"""What a reconcile of multi-node jobs shares with each job's tick (worker.reconcile,
worker.reconcile_tick): the settings, the DB and the store, the launcher, the clock and the
tasks it sends. Its own module, so that the two import it and never each other."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from models.base import utcnow
from storage import ObjectStore
from worker import multinode
from worker.config import WorkerSettings
from worker.launchers.base import Launcher


class ReconcileContext:
    """The launches of one worker process: settings, sessions, store, launcher (made from the
    settings on first use), the clock, and the senders of job and evaluation tasks."""

    def __init__(
        self,
        settings: WorkerSettings,
        sessions: sessionmaker[Session],
        store: ObjectStore,
        launcher: Launcher | None = None,
        *,
        send: Callable[[str], None] | None = None,
        send_evaluation: Callable[[str], None] | None = None,
        clock: Callable[[], datetime] = utcnow,
    ):
        self.settings, self.sessions, self.store = settings, sessions, store
        self._launcher, self.send, self.send_evaluation = launcher, send, send_evaluation
        self.clock = clock

    @property
    def launcher(self) -> Launcher:
        if self._launcher is None:
            self._launcher = multinode.trainjob_launcher(self.settings)
        return self._launcher

    @property
    def hang_seconds(self) -> float:
        return float(self.settings.HANG_SECONDS)
