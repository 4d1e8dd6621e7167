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
        cancelling          delete the launches of this and the previous attempt by their
                            deterministic names → cancelled (at its last checkpoint)
        not yet submitted   submit (a run_job or a retry that died before its submit); a
                            failed submit leaves it unsubmitted, tried again after a backoff
                            (worker.reconcile_watch): no attempt spent
        poll                pending → event `waiting_for_admission`, starting, running (each
                            once per attempt); rank 0's run log from the store into events,
                            metrics and checkpoint rows (worker.progress.RunProgress on a
                            local mirror; a checkpoint row once its _COMPLETE is in the store)
        succeeded           the export committed ({team}/{job}/final/_COMPLETE) → recorded,
                            succeeded; the launch removed
        failed / missing    reason and node 0's log tail (scrubbed) → event `attempt_failed`,
        / hung /            the launch removed, attempt + 1 submitted (it resumes from the last
        not started         committed checkpoint) while the attempts spent < MAX_JOB_ATTEMPTS,
                            else failed; a disruption (DisruptionTarget) spends none
        hung                no new step for HANG_SECONDS since the ranks were admitted (time
                            suspended never counts: worker.reconcile_watch)
        not started         admitted, ranks not all running START_DEADLINE_SECONDS later
        suspended again     Kueue preempted it: event `suspended`; its pods resume (--resume)
        never admitted      ADMISSION_TIMEOUT_SECONDS suspended: failed, with Kueue's reason
    sweep       every TRAINJOB_SWEEP_SECONDS: labelled TrainJobs of ended jobs or of earlier
                attempts are deleted (orphans of a worker that died after a create).
    Every write goes in one transaction with the lease renewal (fenced by owner + attempt);
    a reconcile that stalls past its lease and was taken over writes nothing. The reaper and
    run_job claims leave these rows alone (models.launches.not_reconciled).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy import select

from models import jobs as job_states
from models import launches
from models.launches import TRAINJOB
from models.tables import Job
from worker.config import new_worker_id
from worker.reconcile_context import ReconcileContext
from worker.reconcile_tick import JobTick

log = logging.getLogger("humanline.worker.reconcile")


class Reconciler(ReconcileContext):
    """The launches of one worker process (run_job's first launch, beat's reconcile)."""

    _swept_at: datetime | None = None

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
        self.sweep()
        return done

    def sweep(self) -> list[str]:
        """Every TRAINJOB_SWEEP_SECONDS: delete the labelled TrainJobs no reconcile follows:
        of a job that has ended, or of an attempt before the job's current one (a worker that
        died between a create and its record, a cancel that raced a submit). A job id this
        database does not know is left alone (jobs are never deleted: another deployment's,
        sharing the namespace). Returns the names deleted. Only where multi-node jobs ever ran
        (no cluster client before)."""
        now, period = self.clock(), float(self.settings.TRAINJOB_SWEEP_SECONDS)
        if self._swept_at is not None and (now - self._swept_at).total_seconds() < period:
            return []
        self._swept_at = now
        ever = select(Job.id).where(Job.launcher == TRAINJOB).limit(1)
        try:
            with self.sessions() as s:
                if s.execute(ever).first() is None:
                    return []
            lister = getattr(self.launcher, "list_launches", None)  # the TrainJob launcher's
            found: list[tuple[str, str, int]] = lister() if lister is not None else []
            with self.sessions() as s:
                ids = {job_id for _, job_id, _ in found}
                rows = s.execute(select(Job.id, Job.status, Job.attempt).where(Job.id.in_(ids)))
                jobs = {r.id: (r.status, r.attempt) for r in rows}
            orphans = [
                name
                for name, job_id, attempt in found
                if job_id in jobs
                and (job_states.is_terminal(jobs[job_id][0]) or attempt < jobs[job_id][1])
            ]
            for name in orphans:
                log.warning("sweep: deleting orphaned TrainJob %s", name)
                self.launcher.cancel(name)
            return orphans
        except Exception:  # the next sweep tries again
            log.warning("sweep of orphaned TrainJobs failed", exc_info=True)
            return []


class _FirstLaunch:
    def __init__(self, r: Reconciler, job: Job, worker_id: str):
        self.r, self.job, self.worker_id = r, job, worker_id

    def run(self) -> str:
        tick = JobTick(self.r, self.job, self.worker_id)
        return tick.run(tick.first_launch)
