"""One reconcile of one multi-node job (worker.reconcile's module docstring): JobTick holds
the job's lease for its length and makes every write fenced by it."""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from contract.runs import DATA_QUALITY_FILE, EVENTS_FILE, HEARTBEAT_FILE, METRICS_FILE
from models import jobs as job_states
from models import launches, scheduling
from models.launches import TRAINJOB
from models.tables import Checkpoint, Job
from storage import IncompleteCheckpointError, ObjectNotFound
from storage.keys import final_model_prefix, run_file_key
from worker import multinode
from worker import reconcile_watch as watch
from worker.attempt import MAX_MESSAGE_CHARS, AttemptFailed, LeaseLost
from worker.job_evaluations import create_job_evaluations
from worker.launchers.base import DISRUPTED, Launcher, LaunchState, LaunchStatus
from worker.progress import RunProgress
from worker.reconcile_context import ReconcileContext
from worker.scrub import error_tail, scrub, this_server

log = logging.getLogger("humanline.worker.reconcile")

LOG_TAIL_LINES = 200
RUN_LOG = (METRICS_FILE, EVENTS_FILE, DATA_QUALITY_FILE, HEARTBEAT_FILE)
ANNOUNCE = {
    LaunchState.PENDING: ("waiting_for_admission", "waiting for the cluster to admit {n} nodes"),
    LaunchState.STARTING: ("starting", "admitted; {r} of {t} ranks running"),
    LaunchState.RUNNING: ("running", "all {t} ranks running"),
}


class JobTick:
    """One reconcile of one job, holding its lease (a worker.progress.RunOwner too)."""

    def __init__(self, r: ReconcileContext, job: Job, worker_id: str):
        self.r, self.settings, self.sessions, self.store = r, r.settings, r.sessions, r.store
        self.job = job
        self.job_id, self.team_id = job.id, job.team_id
        self.number, self.status = job.attempt, job.status
        self.worker_id = worker_id
        self.state: dict[str, Any] = dict(job.launch or {})
        self.step, self.total = job.current_step or 0, job.total_steps
        self.run_dir = Path(tempfile.mkdtemp(prefix="humanline-reconcile-"))
        self.heartbeat = SimpleNamespace(lost=threading.Event())  # RunOwner: never set here
        self.log = logging.LoggerAdapter(log, {"job": job.id})
        self.progress: RunProgress | None = None
        self.server = this_server(Path(multinode.RANK_SCRATCH), self.run_dir)
        self.outbox: list[tuple[Callable[[str], None] | None, str]] = []

    @property
    def launcher(self) -> Launcher:
        return self.r.launcher

    # ---- the lease ------------------------------------------------------------------------
    def public(self, value: Any) -> Any:
        return scrub(value, self.server)

    def fenced(self, write: Callable[[Session], Any], **values: Any) -> Any:
        """`write` in one transaction with the renewal (owner + attempt); the launch state,
        step and total are saved with it. LeaseLost when another reconcile has the job."""
        saved = (dict(self.state), self.step, self.total)
        p = self.progress
        if p is not None:
            self.state["metrics_offset"], self.state["events_offset"] = (
                p.metrics.offset,
                p.events.offset,
            )
            self.state["quality_reported"] = p.quality_reported or p.data_quality() is not None
            self.step, self.total = p.step, p.total
        with self.sessions() as s:
            try:
                status = launches.renew(
                    s, self.job_id, self.worker_id, self.number, self.settings.LEASE_SECONDS,
                    now=self.r.clock(), current_step=self.step, total_steps=self.total,
                    launch=dict(self.state), **values,
                )  # fmt: skip
                if status is None:
                    raise LeaseLost(self.job_id)
                self.status = status
                out = write(s)
                s.commit()
                return out
            except BaseException:
                s.rollback()
                self.state, self.step, self.total = saved
                raise

    def run(self, action: Callable[[], str]) -> str:
        try:
            return action()
        except LeaseLost:
            self.log.warning("job %s: lease lost; another reconcile has it", self.job_id)
            return "lost"
        except Exception:  # the store, the DB or the cluster's API: the next reconcile retries
            self.log.exception("job %s: reconcile failed; retried next time", self.job_id)
            return "error"
        finally:
            try:
                with self.sessions() as s:
                    launches.hand_back(
                        s, self.job_id, self.worker_id, self.number, now=self.r.clock(),
                        current_step=self.step, total_steps=self.total, launch=dict(self.state),
                    )  # fmt: skip
                    s.commit()
            except Exception:  # it expires on its own
                self.log.warning("job %s: could not hand the lease back", self.job_id)
            shutil.rmtree(self.run_dir, ignore_errors=True)
            for send, row_id in self.outbox:  # after the commit that made them due
                _send(send, row_id)

    # ---- launching --------------------------------------------------------------------------
    def first_launch(self) -> str:
        self.state = {"attempt": self.number, "submitted": False}
        self.fenced(lambda s: None, launcher=TRAINJOB)
        return self.submit()

    def submit(self) -> str:
        """Submit the current attempt (again: the launcher adopts an existing launch)."""
        if self.status == "cancelling":
            return self.finish("cancelled", result=self.base(), message="cancelled before launch")
        try:
            launcher, n = self.launcher, self.number
        except Exception as exc:  # not configured here: say so rather than keep the job running
            self.log.exception("job %s: no multi-node launcher", self.job_id)
            error = {"type": "no_launcher", "message": f"no multi-node launcher: {exc}"}
            return self.finish("failed", error=self.public(error), message=error["message"])
        now = self.r.clock().timestamp()
        if not watch.submit_due(self.state, now):
            return "backing_off"  # a failed submit waits its backoff
        if n > 1:  # the previous attempt's launch is gone before this one starts
            launcher.cancel(launcher.launch_name(self.job_id, n - 1))
        try:
            multinode.write_spec(
                self.sessions, self.store, self.job_id, self.team_id, n, self.job.spec,
                self.job.training_file_id,
            )  # fmt: skip
        except AttemptFailed as exc:
            return self.finish("failed", error=self.public(exc.error), message=str(exc))
        resume = bool(multinode.committed_checkpoints(self.store, self.team_id, self.job_id))
        estimate = multinode.job_estimate(self.sessions, self.job_id)
        request = multinode.launch_request(self.settings, self.store, self.job, n, estimate)
        try:
            name = launcher.submit(request)
        except Exception as exc:  # the launcher retried transient errors already
            self.log.warning("job %s: submit failed", self.job_id, exc_info=True)
            return self.submit_failed(now, f"{type(exc).__name__}: {exc}")
        watch.submitted(self.state)
        self.state.update(name=name, submitted=True, announced=[])
        data = {
            "attempt": n,
            "nodes": request.nodes,
            "processes_per_node": request.processes_per_node,
            "resume": resume,
        }
        message = (
            f"attempt {n} launched: {request.nodes} nodes x {request.processes_per_node} processes"
        )
        self.fenced(lambda s: job_states.add_event(s, self.job_id, "launched", message, data))
        return "launched"

    def submit_failed(self, now: float, message: str) -> str:
        """The submit failed (the cluster refused it, or did not answer): the attempt stays
        unsubmitted and the next reconcile tries again after a backoff; no attempt is spent.
        Failing for SUBMIT_GIVE_UP_SECONDS in a row fails the job with the cause."""
        n, message = self.number, self.public(message)[:MAX_MESSAGE_CHARS]
        failing = watch.submit_failed(self.state, now, self.settings.SUBMIT_BACKOFF_SECONDS)
        data = {"attempt": n, "failures": self.state["submit_failures"], "message": message}
        if failing >= self.settings.SUBMIT_GIVE_UP_SECONDS:
            text = f"attempt {n} could not be submitted for {failing:.0f} s: {message}"
            error = {"type": "submit_failed", "reason": "submit_failed", **data, "message": text}
            return self.finish("failed", error=error, result=self.base(), message=text)
        text = f"attempt {n} not submitted ({message}); trying again in "
        text += f"{float(self.state['submit_at']) - now:.0f} s"
        self.fenced(lambda s: job_states.add_event(s, self.job_id, "submit_failed", text, data))
        return "submit_failed"

    # ---- following ----------------------------------------------------------------------------
    def reconcile(self) -> str:
        if self.status == "cancelling":
            return self.cancel()
        if not self.state.get("submitted") or self.state.get("attempt") != self.number:
            return self.submit()
        status = self.launcher.poll(self.state["name"])
        self.announce(status)
        if status.state is not LaunchState.PENDING:  # no rank has written anything before
            self.ingest()
        if status.state is LaunchState.SUCCEEDED:
            return self.complete()
        if status.state is LaunchState.FAILED:
            reason, message = status.reason or "Failed", status.message or "a rank failed"
            return self.retry_or_fail(reason, message)
        if status.state is LaunchState.MISSING:
            return self.retry_or_fail("launch_missing", "the launch disappeared from the cluster")
        late = watch.overdue(
            self.state, status, self.r.clock().timestamp(),
            watch.heartbeat_step(self.run_dir / HEARTBEAT_FILE),
            hang_s=self.r.hang_seconds, start_s=self.settings.START_DEADLINE_SECONDS,
            admission_s=self.settings.ADMISSION_TIMEOUT_SECONDS,
        )  # fmt: skip
        if late is not None and late[0] == "admission_timeout":
            return self.not_admitted(late[1])
        if late is not None:
            return self.retry_or_fail(*late)
        return status.state.value

    def not_admitted(self, message: str) -> str:
        """Never admitted in ADMISSION_TIMEOUT_SECONDS: the job fails (another attempt would
        wait in the same queue), with the Kueue Workload's reason when it can be read."""
        name = self.state["name"]
        explain = getattr(self.launcher, "waiting_reason", None)
        try:
            why = explain(name) if explain is not None else ""
        except Exception:
            self.log.warning("job %s: no admission reason", self.job_id, exc_info=True)
            why = ""
        self.launcher.cancel(name)
        text = self.public(f"{message}: {why}" if why else message)[:MAX_MESSAGE_CHARS]
        error = {"type": "admission_timeout", "reason": "admission_timeout", "message": text}
        return self.finish("failed", error={**error, "attempt": self.number}, message=text)

    def announce(self, status: LaunchStatus) -> None:
        """waiting_for_admission, starting, running: each once per attempt."""
        announced = self.state.get("announced", [])
        if status.state is LaunchState.PENDING and {"starting", "running"} & set(announced):
            # suspended again after admission (Kueue preempted it): its pods are gone; when
            # re-admitted they resume (--resume) and are announced again
            self.state["announced"] = [a for a in announced if a == "pending"]
            text = f"suspended by the cluster ({status.reason or 'preempted'}): waiting to be "
            text += "admitted again; it resumes from its last checkpoint"
            data = {"attempt": self.number, "reason": status.reason, "message": status.message}
            self.fenced(lambda s: job_states.add_event(s, self.job_id, "suspended", text, data))
            return
        if status.state not in ANNOUNCE or status.state.value in announced:
            return
        kind, text = ANNOUNCE[status.state]
        nodes, _ = multinode.shape(self.job.spec, self.job.meta)
        message = text.format(n=nodes, r=status.ranks_running, t=status.ranks_total)
        data = {
            "attempt": self.number,
            "ranks_running": status.ranks_running,
            "ranks_total": status.ranks_total,
        }
        self.state["announced"] = [*self.state.get("announced", []), status.state.value]
        self.fenced(lambda s: job_states.add_event(s, self.job_id, kind, message, data))

    def ingest(self) -> None:
        """Rank 0's run log (mirrored by the trainer) and the committed checkpoints → DB."""
        for name in RUN_LOG:
            try:
                self.store.download_file(
                    run_file_key(self.team_id, self.job_id, self.number, name), self.run_dir / name
                )
            except ObjectNotFound:
                pass
        with self.sessions() as s:
            recorded = set(
                s.execute(select(Checkpoint.step).where(Checkpoint.job_id == self.job_id)).scalars()
            )
        p = RunProgress(self, self.step, self.total)
        p.metrics.offset = int(self.state.get("metrics_offset", 0))
        p.events.offset = int(self.state.get("events_offset", 0))
        p.quality_reported = bool(self.state.get("quality_reported", False))
        p.uploaded = multinode.committed_checkpoints(
            self.store, self.team_id, self.job_id, recorded
        )
        p.recorded = recorded
        self.progress = p
        p.sync()
        self.step, self.total = p.step, p.total

    # ---- ends ---------------------------------------------------------------------------------
    def base(self) -> dict[str, Any]:
        p = self.progress
        result: dict[str, Any] = {
            "step": self.step,
            "total_steps": self.total,
            "last_checkpoint_step": max(p.recorded, default=None) if p else None,
            "attempt": self.number,
        }
        quality = p.data_quality() if p else None
        if quality is not None:
            result["data_quality"] = {k: v for k, v in quality.items() if k != "histogram"}
        return result

    def complete(self) -> str:
        prefix = final_model_prefix(self.team_id, self.job_id)
        try:
            entries = self.store.read_manifest(prefix)  # type: ignore[attr-defined]
        except IncompleteCheckpointError:
            return self.retry_or_fail("no_export", "the run ended without a committed export")
        self.launcher.cleanup(self.state["name"])
        result = self.base()
        result["final_model"] = {
            "prefix": prefix,
            "files": [path for path, _ in entries],
            "bytes": sum(size for _, size in entries),  # the storage quota counts them
        }
        return self.finish("succeeded", result=result)

    def cancel(self) -> str:
        """Delete the launches of the current and previous attempts by their deterministic
        names: one created by a worker that died before it recorded the name is deleted too."""
        name, n, of = self.state.get("name"), self.number, self.launcher.launch_name
        names = {of(self.job_id, n), *([of(self.job_id, n - 1)] if n > 1 else [])}
        for each in sorted(names | ({name} if isinstance(name, str) else set())):
            self.launcher.cancel(each)
        if name:
            try:
                self.ingest()
            except Exception:  # the run log is a nicety here; the cancel is not
                self.log.warning("job %s: run log not read", self.job_id, exc_info=True)
        result = self.base()
        step = result["last_checkpoint_step"]
        where = f"at step {step}" if step else "before its first checkpoint"
        return self.finish("cancelled", result=result, message=f"cancelled {where}")

    def retry_or_fail(self, reason: str, message: str) -> str:
        """The attempt failed: its launch removed, then attempt + 1 or the job failed."""
        n, name = self.number, self.state.get("name")
        free = int(self.state.get("free", 0))  # attempts that ended by a disruption: not spent
        disrupted = reason == DISRUPTED and free < self.settings.MAX_DISRUPTIONS
        free += disrupted
        tail = ""
        if name:
            try:
                tail = error_tail(self.launcher.logs(name, LOG_TAIL_LINES), self.server)
            except Exception:
                self.log.warning("job %s: no log tail", self.job_id, exc_info=True)
            self.launcher.cancel(name)  # stops it if it still runs (a hang), else removes it
        message = self.public(message)[:MAX_MESSAGE_CHARS]
        error = {
            "type": "launch_failed",
            "reason": reason,
            "message": message,
            "attempt": n,
            "log_tail": tail,
        }
        spent = n - free
        if spent >= self.settings.MAX_JOB_ATTEMPTS:
            error["message"] = (
                f"attempt {n} failed ({reason}): {message}; {spent} attempts exhausted"
            )
            return self.finish("failed", error=error, result=self.base(), message=error["message"])
        text = f"attempt {n} failed ({reason}): {message}; retrying as attempt {n + 1}"
        text += " (a disruption: no attempt spent)" if disrupted else ""
        self.state = {"attempt": n + 1, "submitted": False, "free": free}
        self.progress = None  # the next attempt has its own run log
        self.fenced(
            lambda s: job_states.add_event(s, self.job_id, "attempt_failed", text, error),
            new_attempt=n + 1,
        )
        self.number = n + 1
        return self.submit()

    def finish(self, status: str, *, error=None, result=None, message=None) -> str:
        evaluations: list[str] = []
        wake: list[str] = []

        def write(s: Session) -> bool:
            done = job_states.finish(
                s, self.job_id, self.worker_id, status, error=error, result=result, message=message
            )
            if done and status == "succeeded":
                evaluations[:] = create_job_evaluations(
                    s, self.job_id, self.settings.MAX_EVALS_PER_TEAM
                )
            if done and self.settings.TEAM_MAX_RUNNING > 0:
                wake[:] = filter(None, [scheduling.next_queued_of_team(s, self.team_id)])
            return done

        if not self.fenced(write):
            raise LeaseLost(self.job_id)
        self.outbox += [(self.r.send_evaluation, e) for e in evaluations]
        self.outbox += [(self.r.send, j) for j in wake]
        self.log.info("job %s: %s", self.job_id, status)
        return status


def _send(send: Callable[[str], None] | None, row_id: str) -> None:
    if send is None:
        return
    try:
        send(row_id)
    except Exception:
        log.warning("could not send %s", row_id, exc_info=True)
