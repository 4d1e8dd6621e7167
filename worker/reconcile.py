"""The control plane of multi-node jobs (launcher 'trainjob', design26 §6): Celery starts
them, a short periodic task follows them. Nothing runs in a worker process for the length of
the job; the DB row and the store hold everything, so any worker can pick a job up.

    launch      run_job claims a job whose parallelism.nodes > 1 (worker.runner): it gets
                launcher 'trainjob', the attempt's spec goes to the store, the launch is
                submitted (idempotent: the launcher names it from job id + attempt), event
                `launched`, and the lease is handed back: the job stays `running`.
    reconcile   `Reconciler.run_once` (Celery beat: worker.tasks.reconcile_jobs, every
                RECONCILE_SECONDS): each launched job whose lease is free is taken
                (models.launches: guarded by owner + attempt) for one JobTick:
        cancelling          cancel the launch → cancelled (at its last checkpoint)
        not yet submitted   submit (a run_job or a retry that died before its submit)
        poll                pending → event `waiting_for_admission`, starting, running (each
                            once per attempt); rank 0's run log from the store into events,
                            metrics and checkpoint rows (worker.progress.RunProgress on a
                            local mirror; a checkpoint row once its _COMPLETE is in the store)
        succeeded           the export committed ({team}/{job}/final/_COMPLETE) → recorded,
                            succeeded; the launch removed
        failed / missing    reason and node 0's log tail (scrubbed) → event `attempt_failed`,
        / hung              the launch removed, attempt + 1 submitted (it resumes from the last
                            committed checkpoint) while attempt < MAX_JOB_ATTEMPTS, else failed
        hung                no new step for HANG_SECONDS since the ranks were admitted
    Every write goes in one transaction with the lease renewal (fenced by owner + attempt);
    a reconcile that stalls past its lease and was taken over writes nothing. The reaper and
    run_job claims leave these rows alone (models.launches.not_reconciled).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from models import launches
from models.base import utcnow
from models.tables import Job
from storage import ObjectStore
from worker import multinode
from worker.config import WorkerSettings, new_worker_id
from worker.launchers.base import Launcher
from worker.reconcile_tick import JobTick

log = logging.getLogger("humanline.worker.reconcile")


class Reconciler:
    """The launches of one worker process (run_job's first launch, beat's reconcile)."""

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

    def first_launch(self, job: Job, worker_id: str) -> Any:
        """run_job's attempt (worker.attempt.claim_and_run runs it): `job` was just claimed
        by `worker_id`; submit it, return "launched"."""
        return _FirstLaunch(self, job, worker_id)

    def run_once(self) -> dict[str, str]:
        """One reconcile of every launched job whose lease is free: {job id: outcome}."""
        with self.sessions() as s:
            rows = launches.reconciled_rows(s)
        done: dict[str, str] = {}
        for row in rows:
            now = self.clock()
            if row.lease_expires_at is not None and row.lease_expires_at >= now:
                continue  # another reconcile (or the launching run_job) holds it
            worker_id = new_worker_id()
            with self.sessions() as s:
                won = launches.take(
                    s, row.id, worker_id, seen_owner=row.lease_owner, seen_attempt=row.attempt,
                    lease_seconds=self.settings.LEASE_SECONDS, now=now,
                )  # fmt: skip
                s.commit()
            if not won:
                continue
            with self.sessions() as s:
                job = s.get(Job, row.id)
                s.expunge_all()
            if job is None:
                continue
            tick = JobTick(self, job, worker_id)
            if not launches.handed_back(row.lease_expires_at, row.heartbeat_at):
                tick.log.warning("the reconcile of %s was lost; taken over", row.lease_owner)
            done[row.id] = tick.run(tick.reconcile)
        return done


class _FirstLaunch:
    def __init__(self, r: Reconciler, job: Job, worker_id: str):
        self.r, self.job, self.worker_id = r, job, worker_id

    def run(self) -> str:
        tick = JobTick(self.r, self.job, self.worker_id)
        return tick.run(tick.first_launch)
