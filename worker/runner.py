"""Training: one attempt at one job, on the life cycle of worker.attempt.

    prepare    download the training file (named by its id, in the attempt's directory: the
               trainer's working directory, so the spec names it as the team did and the
               spec.json of every checkpoint holds no server path), write the spec, download the
               newest complete checkpoint into RUN_DIR/checkpoints/step-N (→ --resume), place
               the processes (`placement`, worker.routing) and build the launch (`launch`:
               worker.launch.trainer_command, worker.routing.trainer_env): `python -m
               trainer run`, or `accelerate launch` for several processes.
    on_poll    metrics.jsonl and events.jsonl into the DB, every new complete checkpoint dir
               uploaded, then recorded (worker.progress.RunProgress); a stop request
               (`cancelling`, a worker shutdown) → touch RUN_DIR/STOP (contract.runs).
    conclude   upload what is left and the exported model, then finish: succeeded, cancelled
               (a stop we asked for after a cancel), failed (with the trainer's stderr tail),
               or released back to the queue (a worker shutdown; out of memory with several
               processes, with a smaller micro-batch for the next attempt: worker.micro_batch).

Durability: a checkpoint row is written only after its objects (and their `_COMPLETE`
marker) are in the store, and a job is finished only after everything it produced is in
the DB or the store; every write is fenced by the lease (worker.attempt).

Failures of the worker's own machinery (store or DB down) do not fail the job: the attempt
stops heart-beating, the lease expires, and the reaper requeues the job (at most
MAX_JOB_ATTEMPTS attempts), which resumes from its last recorded checkpoint.
"""

from __future__ import annotations

import json
import logging
import random
import signal
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from contract.runs import (
    EXIT_INVALID_SPEC,
    EXIT_OK,
    EXIT_STOPPED,
    FINAL_DIR,
    OUT_OF_MEMORY_EVENT,
    STOP_FILE,
)
from models import jobs as job_states
from models import scheduling
from models.tables import Job
from storage import ObjectStore
from storage.keys import final_model_prefix
from worker import inputs, micro_batch, multinode
from worker.attempt import (
    MAX_MESSAGE_CHARS,
    AttemptFailed,
    Launch,
    LeasedAttempt,
    claim_and_run,
    kill_group,
)
from worker.config import WorkerSettings
from worker.gpus import place_attempt
from worker.job_evaluations import create_job_evaluations
from worker.launch import trainer_command
from worker.launchers.base import Launcher
from worker.progress import UPLOAD_ATTEMPTS, RunProgress
from worker.reconcile import Reconciler
from worker.routing import Placement, PlacementError, queue_for, trainer_env

log = logging.getLogger("humanline.worker")

CLAIM_TRIES = 8  # a claim that keeps meeting other workers' team locks, then gives up


class Attempt(LeasedAttempt):
    """One attempt at one training job."""

    kind = "job"

    def __init__(self, runner: Runner, job: Job, worker_id: str):
        super().__init__(
            runner.settings,
            runner.sessions,
            row_id=job.id,
            worker_id=worker_id,
            number=job.attempt,
            should_stop=runner.should_stop,
        )
        self.store = runner.store
        self.send = runner.send
        self.send_evaluation = runner.send_evaluation
        self.job_id = job.id
        self.team_id = job.team_id
        self.spec: dict[str, Any] = dict(job.spec)
        self.meta: dict[str, Any] = dict(job.meta or {})
        self.training_file_id = job.training_file_id
        self.status = job.status
        self.run_dir = self.dir / "run"
        self.resumed_from: int | None = None
        self.micro_batch: dict[str, int] | None = None  # RUN_DIR/micro_batch.json at start
        self.progress = RunProgress(self, job.current_step or 0, job.total_steps)
        # Wall-clock time, all attempts together: what ran before this claim plus our clock.
        self.max_runtime = runner.settings.max_runtime(self.spec.get("max_runtime"))
        self.runtime_before = float(job.runtime_seconds or 0.0)
        self.clock = time.monotonic()

    @property
    def runtime(self) -> float:
        return self.runtime_before + time.monotonic() - self.clock

    # ---- the lease ------------------------------------------------------------------------------
    def renew(self, s: Session) -> str | None:
        return job_states.heartbeat(
            s,
            self.job_id,
            self.worker_id,
            self.settings.LEASE_SECONDS,
            current_step=self.progress.step,
            total_steps=self.progress.total,
            runtime_seconds=round(self.runtime, 3),
        )

    def warn(self, message: str) -> None:
        try:
            text = self.public(message[:MAX_MESSAGE_CHARS])
            self.fenced(lambda s: job_states.add_event(s, self.job_id, "warning", text))
        except Exception:  # best effort: the DB may be the thing that failed
            log.debug("could not record a warning", exc_info=True)

    # ---- prepare ----------------------------------------------------------------------------
    def prepare(self) -> Launch:
        self.run_dir.mkdir(parents=True)
        name = str(self.training_file_id)  # an id of ours ("file-<hex>"): a plain file name
        inputs.download_training_file(self, self.dir / name)
        spec = {**self.spec, "training_file": name}  # relative to the trainer's cwd, self.dir
        (self.dir / "spec.json").write_text(json.dumps(spec, indent=2))
        world = inputs.download_checkpoint(self)
        self.micro_batch = inputs.write_micro_batch(self)  # it ran out of memory before
        try:
            place = place_attempt(self.settings, self.spec, self.meta, world)  # loud if no GPU
        except PlacementError as exc:
            raise AttemptFailed(str(exc), "placement_error") from None
        return self.launch(place)

    def launch(self, place: Placement) -> Launch:
        """The trainer's command line and environment for `place`."""
        argv = trainer_command(
            self.settings.TRAINER_PYTHON,
            self.dir / "spec.json",
            self.run_dir,
            resume=self.resumed_from is not None,
            place=place,
        )
        # A launcher (accelerate) gets SIGTERM so it can stop its ranks; a lone trainer SIGKILL.
        deathsig = signal.SIGTERM if place.num_processes > 1 else signal.SIGKILL
        return Launch(argv, trainer_env(place), deathsig)

    def before_start(self) -> str | None:
        if self.status == "cancelling":  # cancelled while we were downloading
            return self.finish("cancelled", message="cancelled before training started")
        return super().before_start()

    # ---- while it trains --------------------------------------------------------------------
    def on_poll(self) -> None:
        try:
            self.sync()
        except (OperationalError, InterfaceError):
            # The DB blinked: nothing was recorded, the next sync tries again. If it stays
            # away past the lease, the reaper requeues the job and the fence stops us.
            self.log.warning("could not record progress; retrying", exc_info=True)

    def sync(self) -> None:
        self.progress.sync()

    def stop_wanted(self) -> str | None:
        if (reason := super().stop_wanted()) is not None:
            return reason
        return "max_runtime" if self.runtime >= self.max_runtime else None

    def request_stop(self, reason: str) -> None:
        """The trainer checkpoints and exits(3) at its next step boundary. Before its first
        step (loading the model, scoring the data: minutes for a large model) there is
        nothing to save: it is stopped at once."""
        if not self.progress.started:
            self.killed = True
            kill_group(self.proc)
            return
        (self.run_dir / STOP_FILE).touch()

    # ---- conclude ---------------------------------------------------------------------------
    def conclude(self, rc: int) -> str:
        p = self.progress
        p.upload_new_checkpoints(required=True)
        p.sync()  # records what the last upload added (and anything written meanwhile)
        base: dict[str, Any] = {
            "step": p.step,
            "total_steps": p.total,
            "last_checkpoint_step": max(p.recorded, default=None),
            "attempt": self.number,
        }
        quality = p.data_quality()
        if quality is not None:  # the histogram is in the data_quality event
            base["data_quality"] = {k: v for k, v in quality.items() if k != "histogram"}
        if rc == EXIT_OK:
            final = self.run_dir / FINAL_DIR
            if final.is_dir():
                prefix = final_model_prefix(self.team_id, self.job_id)
                files = p.upload_dir(prefix, final, attempts=UPLOAD_ATTEMPTS)
                base["final_model"] = {
                    "prefix": prefix,
                    "files": files,
                    # counted by the team's storage quota (models.quota.storage_use)
                    "bytes": sum(f.stat().st_size for f in final.rglob("*") if f.is_file()),
                }
            return self.finish("succeeded", result=base)
        record = micro_batch.ran_out(self.run_dir, self.micro_batch)  # out of memory
        if self.stop_reason is not None and (rc == EXIT_STOPPED or self.killed or record):
            return self.stopped(self.stop_reason, base)  # asked to stop: that comes first
        if record is not None:
            return self.out_of_memory(record, base)
        error = self.crash(rc, "the trainer", "trainer_error")
        if rc == EXIT_INVALID_SPEC:
            error["type"] = "invalid_spec"
        elif rc == EXIT_STOPPED:
            error["message"] = "the trainer stopped without being asked to"
        return self.finish("failed", error=error, result=base)

    def stopped(self, reason: str, base: dict[str, Any]) -> str:
        """The trainer stopped because we asked (or we killed it): the job is where its last
        checkpoint is, and that is the step it reports."""
        p = self.progress
        checkpoint = max(p.recorded, default=None)
        p.step = checkpoint or 0
        base["step"] = p.step
        if checkpoint:
            where = f"at step {p.step}"
        else:
            where = "at step 0 (no checkpoint yet)" if p.started else "before training started"
        if reason == "shutdown":
            return self.release()
        if reason == "cancel":
            return self.finish("cancelled", result=base, message=f"cancelled {where}")
        limit = f"max_runtime of {self.max_runtime:g} s"
        message = f"stopped {where}: the job ran past its {limit}"
        error = {
            "type": "max_runtime_exceeded",
            "message": message,
            "max_runtime": self.max_runtime,
            "step": p.step,
        }
        event = ("max_runtime_exceeded", message, {"max_runtime": self.max_runtime, **base})
        return self.finish("failed", error=error, result=base, message=message, event=event)

    def out_of_memory(self, record: dict[str, int], base: dict[str, Any]) -> str:
        """Several processes ran out of memory: requeue the job (the next attempt starts
        with `record`'s micro-batch), or fail it once its attempts are spent."""
        p, max_attempts = self.progress, self.settings.MAX_JOB_ATTEMPTS
        event = None  # the record the next attempt reads, unless the trainer's is there
        if p.out_of_memory != record:
            message = f"out of memory; the next attempt uses {micro_batch.describe(record)}"
            event = (OUT_OF_MEMORY_EVENT, message, {**record, "attempt": self.number})
        if self.number >= max_attempts:
            error = micro_batch.exhausted_error(record, self.number, p.started_data)
            return self.finish(
                "failed", error=error, result=base, message=error["message"], event=event
            )
        return self.release(micro_batch.requeue_reason(record, self.number, max_attempts), event)

    def fail(self, error: dict[str, Any]) -> str:
        # the `failed` event says why (e.g. the GPUs a placement needs), not only the transition
        message = str(error.get("message", ""))[:MAX_MESSAGE_CHARS]
        return self.finish("failed", error=error, message=message)

    def finish(self, status: str, *, error=None, result=None, message=None, event=None) -> str:
        error, message, event = self.public(error), self.public(message), self.public(event)
        evaluations: list[str] = []
        wake: list[str] = []

        def write(s: Session) -> bool:
            if event is not None:  # (kind, message, data): said next to the status change
                job_states.add_event(s, self.job_id, *event)
            done = job_states.finish(
                s, self.job_id, self.worker_id, status, error=error, result=result, message=message
            )
            if done and status == "succeeded":  # same transaction: none can be lost
                evaluations[:] = create_job_evaluations(
                    s, self.job_id, self.settings.MAX_EVALS_PER_TEAM
                )
            if done and self.settings.TEAM_MAX_RUNNING > 0:
                # A slot under the team's limit is free: wake a worker for its next job,
                # whose own wake-up was dropped while the team was at its limit.
                wake[:] = filter(None, [scheduling.next_queued_of_team(s, self.team_id)])
            return done

        self.end(write)
        self.log.info("%s", status)
        for evaluation_id in evaluations:  # a lost send is re-sent by the reaper's sweep
            _send(self.send_evaluation, evaluation_id, self.log)
        for job_id in wake:
            _send(self.send, job_id, self.log)
        return status

    def release(self, reason: str = "worker shutting down", event=None) -> str:
        """Worker shutdown (or out of memory): the checkpoint is uploaded; give the job back
        (with `event`, if any: (kind, message, data)) and send it again so another worker
        resumes it now."""
        reason, event = self.public(reason), self.public(event)

        def write(s: Session) -> bool:
            if event is not None:
                job_states.add_event(s, self.job_id, *event)
            return job_states.release(s, self.job_id, self.worker_id, reason)

        self.end(write)
        _send(self.send, self.job_id, self.log)  # if lost, the stale-queued sweep sends it
        return "released"


def _send(send: Callable[[str], None] | None, row_id: str, logger: Any) -> None:
    if send is None:
        return
    try:
        send(row_id)
    except Exception:
        logger.warning("could not send %s", row_id, exc_info=True)


class Runner:
    """Runs attempts for one worker process (Celery task or embedded thread): jobs with
    `run`, evaluations with `evaluate` (worker.evaluate)."""

    def __init__(
        self,
        settings: WorkerSettings,
        sessions: sessionmaker[Session],
        store: ObjectStore,
        *,
        send: Callable[[str], None] | None = None,
        send_evaluation: Callable[[str], None] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        launcher: Launcher | None = None,
    ):
        self.settings, self.sessions, self.store = settings, sessions, store
        self.send, self.send_evaluation, self.should_stop = send, send_evaluation, should_stop
        self._reconciler: Reconciler | None = None
        self.launcher = launcher  # multi-node jobs' (None: worker.multinode.trainjob_launcher)

    def run(self, job_id: str, queue: str | None = None) -> str | None:
        """A wake-up for one free slot: claim the fairest claimable job (models.scheduling;
        `job_id` itself when its own worker died) among those routed to `queue` (None: any)
        and run it. Returns None when nothing was ours to run (safe to call twice), else how
        the attempt ended: succeeded, failed, cancelled, released (worker shutdown), lost
        (another worker took over) or abandoned (worker error; retried)."""
        cpu_models = self.settings.cpu_models

        def routable(row: Any) -> bool:
            return queue is None or queue_for(row.base_model, row.meta, cpu_models) == queue

        def claim(s: Session, row_id: str, worker_id: str, lease: float) -> Job | None:
            for attempt in range(CLAIM_TRIES):
                try:
                    return scheduling.claim_for(s, row_id, scheduling.Claimant(
                        worker_id, lease, self.settings.TEAM_MAX_RUNNING, routable
                    ))  # fmt: skip
                except scheduling.Contended:  # another worker was claiming the same team
                    s.rollback()
                    time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
            _send(self.send, row_id, log)  # still contended: keep the wake-up for later
            return None

        return claim_and_run(
            "job", self.sessions, claim, self.start, job_id, self.settings.LEASE_SECONDS
        )

    def start(self, job: Job, worker_id: str) -> Any:
        """The claimed job's attempt: here, or on the cluster (nodes > 1: worker.reconcile)."""
        if multinode.is_multinode(job.launcher, job.spec):
            return self.reconciler().first_launch(job, worker_id)
        return Attempt(self, job, worker_id)

    def reconciler(self) -> Reconciler:
        """The multi-node control plane (its launcher made on first use)."""
        if self._reconciler is None:
            r = Reconciler(self.settings, self.sessions, self.store, self.launcher)
            r.send, r.send_evaluation, self._reconciler = self.send, self.send_evaluation, r
        return self._reconciler

    def evaluate(self, evaluation_id: str) -> str | None:
        """Claim and run one evaluation (worker.evaluate.run_evaluation)."""
        from worker.evaluate import run_evaluation

        return run_evaluation(
            evaluation_id,
            self.sessions,
            self.store,
            self.settings,
            send=self.send_evaluation,
            should_stop=self.should_stop,
        )
