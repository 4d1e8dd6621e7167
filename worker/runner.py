"""One attempt at one job, top to bottom: claim → prepare → train (subprocess) → conclude.

    claim        models.jobs.claim: a guarded UPDATE; losing it (duplicate delivery, job
                 finished, cancelled, leased by a live worker) means return at once.
    prepare      download the training file, write the spec with its local path, download the
                 newest complete checkpoint into RUN_DIR/checkpoints/step-N (→ --resume).
    train        `python -m trainer run` (or `accelerate launch`) in its own process group,
                 killed with us (PR_SET_PDEATHSIG). Every WORKER_POLL_SECONDS: metrics.jsonl and
                 events.jsonl into the DB, every new complete checkpoint dir uploaded, then
                 recorded; `cancelling` (or a worker shutdown) → touch RUN_DIR/STOP.
    conclude     upload what is left and the exported model, then finish: succeeded, cancelled
                 (a stop we asked for after a cancel), failed (with the trainer's stderr tail),
                 or released back to the queue (a worker shutdown).

Durability: a checkpoint row is written only after its objects (and their `_COMPLETE`
marker) are in the store, and a job is finished only after everything it produced is in
the DB or the store. Every DB write of a running attempt goes in one transaction with a
heartbeat (`_fenced`): if the lease was lost (the reaper requeued the job, another worker
reclaimed it) the heartbeat matches no row, the transaction is rolled back and the attempt
stops without writing anything, so a zombie attempt cannot record over the live one.

A heartbeat thread also renews the lease while the main thread is busy (big uploads and
downloads), at min(HEARTBEAT_SECONDS, LEASE_SECONDS / 3).

Failures of the worker's own machinery (store or DB down) do not fail the job: the attempt
stops heart-beating, the lease expires, and the reaper requeues the job (at most
MAX_JOB_ATTEMPTS attempts), which resumes from its last recorded checkpoint.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from models import jobs as job_states
from models.tables import Checkpoint, File, Job
from storage import IncompleteCheckpointError, ObjectNotFound, ObjectStore, StorageError
from storage.keys import checkpoint_prefix, job_prefix
from worker.config import WorkerSettings, new_worker_id
from worker.job_evaluations import create_job_evaluations
from worker.routing import PlacementError, placement, trainer_command, trainer_env
from worker.tail import JsonlTail

log = logging.getLogger("humanline.worker")

EXIT_OK, EXIT_INVALID_SPEC, EXIT_STOPPED = 0, 2, 3
STOP_FILE = "STOP"
_STEP_DIR = re.compile(r"step-(0|[1-9][0-9]*)")
# Trainer event kinds copied into the job's events. The trainer's own `checkpoint` event
# (saved locally) is not: the DB gets its `checkpoint` event once the checkpoint is uploaded.
_TRAINER_EVENTS = frozenset({"data", "warning", "started", "resumed", "stopped", "finished"})
UPLOAD_ATTEMPTS = 3


class _JobLog(logging.LoggerAdapter):
    """Prefixes "job <id>: " (Celery's log format shows no `extra`)."""

    def process(self, msg, kwargs):
        return f"job {self.extra['job_id']}: {msg}", kwargs


class JobFailed(Exception):
    """A failure of the job itself (bad data, bad spec, trainer crash): the job fails."""

    def __init__(self, message: str, type: str = "job_error", **details: Any):
        super().__init__(message)
        self.error = {"type": type, "message": message, **details}


class LeaseLost(Exception):
    """Another attempt owns the job now: stop without writing anything."""


# --- the subprocess ---------------------------------------------------------------------------


def _die_with_parent(sig: int) -> Callable[[], None] | None:
    """A preexec_fn that makes the child get `sig` when the thread that started it dies
    (Linux PR_SET_PDEATHSIG), so a SIGKILLed worker cannot leave training running. Everything
    is looked up before the fork: the child only makes two plain calls."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:  # pragma: no cover - no glibc
        return None
    parent = os.getpid()
    getppid, exit_now = os.getppid, os._exit

    def preexec() -> None:
        prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        if getppid() != parent:  # the parent died before prctl took effect
            exit_now(1)

    return preexec


def _kill(proc: subprocess.Popen | None) -> None:
    """SIGKILL the trainer's whole process group (accelerate's ranks included)."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def stderr_error(path: Path, rc: int, limit: int) -> dict[str, Any]:
    """job.error for a trainer that exited with `rc`: the exception line as the message
    and the tail of stderr (progress bars and all) as details."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - limit))
            tail = fh.read().decode("utf-8", "replace")
    except FileNotFoundError:
        tail = ""
    lines = [ln.strip() for ln in re.split(r"[\r\n]+", tail) if ln.strip()]
    last = lines[-1] if lines else ""
    if rc < 0:
        message = f"the trainer was killed by signal {-rc}"
    else:
        message = f"the trainer exited with code {rc}" + (f": {last}" if last else "")
    return {
        "type": "trainer_error",
        "message": message[:1000],
        "exit_code": rc,
        "stderr_tail": tail,
    }


# --- the lease ---------------------------------------------------------------------------------


class Heartbeat(threading.Thread):
    """Renews the lease in the background; sets `lost` when it is gone."""

    def __init__(self, attempt: Attempt):
        super().__init__(name=f"heartbeat-{attempt.job_id}", daemon=True)
        self.attempt = attempt
        self.lost = threading.Event()
        self._stop_event = threading.Event()

    def run(self) -> None:
        a = self.attempt
        while not self._stop_event.wait(a.settings.heartbeat_seconds):
            try:
                with a.sessions() as s:
                    a.beat(s)
                    s.commit()
            except LeaseLost:
                self.lost.set()
                return
            except Exception:  # the DB blinked: keep trying until the lease ends
                a.log.warning("heartbeat failed", exc_info=True)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=10)


# --- one attempt -------------------------------------------------------------------------------


class Attempt:
    def __init__(self, runner: Runner, job: Job, worker_id: str):
        self.settings = runner.settings
        self.sessions = runner.sessions
        self.store = runner.store
        self.send = runner.send
        self.send_evaluation = runner.send_evaluation
        self.should_stop = runner.should_stop
        self.worker_id = worker_id
        self.job_id = job.id
        self.team_id = job.team_id
        self.spec: dict[str, Any] = dict(job.spec)
        self.meta: dict[str, Any] = dict(job.meta or {})
        self.training_file_id = job.training_file_id
        self.number = job.attempt
        self.status = job.status
        self.step = job.current_step or 0
        self.total = job.total_steps
        root = Path(self.settings.WORKER_DIR).resolve() / job.id
        self.dir = root / f"attempt-{job.attempt}-{worker_id.rsplit(':', 1)[-1]}"
        self.run_dir = self.dir / "run"
        self.metrics = JsonlTail(self.run_dir / "metrics.jsonl")
        self.events = JsonlTail(self.run_dir / "events.jsonl")
        self.uploaded: dict[int, tuple[str, list[str], int]] = {}  # step → prefix, files, bytes
        self.recorded: set[int] = set()
        self.resumed_from: int | None = None
        self.stop_reason: str | None = None
        self.quality_reported = False
        self.proc: subprocess.Popen | None = None
        self.heartbeat = Heartbeat(self)
        self.log = _JobLog(log, {"job_id": job.id})

    # ---- lease helpers ------------------------------------------------------------------------
    def beat(self, s: Session) -> str:
        status = job_states.heartbeat(
            s,
            self.job_id,
            self.worker_id,
            self.settings.LEASE_SECONDS,
            current_step=self.step,
            total_steps=self.total,
        )
        if status is None:
            raise LeaseLost(self.job_id)
        self.status = status
        return status

    def _fenced(self, write: Callable[[Session], Any]) -> Any:
        """Run `write` in one transaction with a heartbeat: all of it lands only while we
        still hold the lease."""
        with self.sessions() as s:
            try:
                self.beat(s)
                out = write(s)
                s.commit()
                return out
            except BaseException:
                s.rollback()
                raise

    # ---- the whole attempt --------------------------------------------------------------------
    def run(self) -> str:
        self.heartbeat.start()
        try:
            try:
                place = self.prepare()
            except (JobFailed, PlacementError) as exc:
                error = (
                    exc.error
                    if isinstance(exc, JobFailed)
                    else {"type": "placement_error", "message": str(exc)}
                )
                return self.finish("failed", error=error)
            if self.status == "cancelling":  # cancelled while we were downloading
                return self.finish("cancelled", message="cancelled before training started")
            if self.should_stop():  # shutting down: leave the job to another worker
                return self.release()
            rc = self.train(place)
            return self.conclude(rc)
        except LeaseLost:
            self.log.warning("lease lost; stopping this attempt")
            return "lost"
        except Exception as exc:  # our machinery failed (store, DB): the reaper retries
            self.log.exception("attempt failed; the job is retried after its lease expires")
            self._warn(f"worker error, retrying after the lease expires: {exc}")
            return "abandoned"
        finally:
            _kill(self.proc)
            self.heartbeat.stop()
            if not self.settings.KEEP_RUN_DIRS:
                shutil.rmtree(self.dir, ignore_errors=True)

    def _warn(self, message: str) -> None:
        try:
            self._fenced(lambda s: job_states.add_event(s, self.job_id, "warning", message[:2000]))
        except Exception:  # best effort: the DB may be the thing that failed
            log.debug("could not record a warning", exc_info=True)

    # ---- prepare --------------------------------------------------------------------------
    def prepare(self):
        for old in self.dir.parent.glob("attempt-*"):  # earlier attempts on this machine
            shutil.rmtree(old, ignore_errors=True)
        self.run_dir.mkdir(parents=True)
        data = self.dir / "train.jsonl"
        self._download_training_file(data)
        spec = {**self.spec, "training_file": str(data)}
        (self.dir / "spec.json").write_text(json.dumps(spec, indent=2))
        world = self._download_checkpoint()
        return placement(self.meta, self.settings.gpu_ids, world)

    def _download_training_file(self, dest: Path) -> None:
        with self.sessions() as s:
            row = s.get(File, self.training_file_id) if self.training_file_id else None
            key = row.object_key if row is not None else None
        if key is None:
            raise JobFailed("the job's training file was deleted", "missing_file")
        try:
            self.store.download_file(key, dest)
        except ObjectNotFound:
            raise JobFailed(
                f"the training file {self.training_file_id} is missing from the store",
                "missing_file",
            ) from None

    def _download_checkpoint(self) -> int | None:
        """Newest complete checkpoint → run/checkpoints/step-N; returns its world size (None:
        start from scratch). A torn one (should not happen: rows follow uploads) is skipped
        for the one before it."""
        with self.sessions() as s:
            rows = s.execute(
                select(Checkpoint.step, Checkpoint.object_prefix)
                .where(Checkpoint.job_id == self.job_id)
                .order_by(Checkpoint.step.desc())
            ).all()
        for step, prefix in rows:
            dest = self.run_dir / "checkpoints" / f"step-{step}"
            try:
                self.store.download_dir(prefix, dest)
            except IncompleteCheckpointError as exc:
                self._warn(f"checkpoint at step {step} is unusable ({exc}); trying an older one")
                continue
            state = json.loads((dest / "state.json").read_text())
            self.resumed_from = step
            self.step = step
            self.uploaded[step] = (prefix, [], 0)
            self.recorded.add(step)
            self.log.info("resuming from step %d", step)
            return int(state.get("world_size", 1))
        if rows:
            self._warn("no usable checkpoint; training starts from scratch")
        return None

    # ---- train ------------------------------------------------------------------------------
    def train(self, place) -> int:
        argv = trainer_command(
            self.settings.TRAINER_PYTHON,
            self.dir / "spec.json",
            self.run_dir,
            resume=self.resumed_from is not None,
            place=place,
        )
        # A launcher (accelerate) gets SIGTERM so it can stop its ranks; a lone trainer SIGKILL.
        deathsig = signal.SIGTERM if place.num_processes > 1 else signal.SIGKILL
        self.log.info("starting trainer: %s", " ".join(argv))
        with open(self.dir / "stdout.log", "wb") as out, open(self.dir / "stderr.log", "wb") as err:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=trainer_env(place),
                cwd=self.dir,
                start_new_session=True,  # its own process group: killpg reaches every rank
                # Safe with threads: it makes two plain libc calls prepared before the fork.
                preexec_fn=_die_with_parent(deathsig),  # noqa: PLW1509
            )
        poll = self.settings.WORKER_POLL_SECONDS
        while True:
            rc = self.proc.poll()
            try:
                self.sync()  # after poll(): once it has exited, this sync sees all its output
            except (OperationalError, InterfaceError):
                # The DB blinked: nothing was recorded, the next sync tries again. If it stays
                # away past the lease, the reaper requeues the job and the fence stops us.
                self.log.warning("could not record progress; retrying", exc_info=True)
            if rc is not None:
                return rc
            if self.heartbeat.lost.is_set():
                raise LeaseLost(self.job_id)
            if self.stop_reason is None:
                if self.status == "cancelling":
                    self.request_stop("cancel")
                elif self.should_stop():
                    self.request_stop("shutdown")
            try:
                self.proc.wait(timeout=poll)
            except subprocess.TimeoutExpired:
                pass

    def request_stop(self, reason: str) -> None:
        """The trainer checkpoints and exits(3) at its next step boundary."""
        self.stop_reason = reason
        (self.run_dir / STOP_FILE).touch()
        self.log.info("asked the trainer to stop (%s)", reason)

    # ---- records and checkpoints ----------------------------------------------------------------
    def sync(self) -> None:
        """Trainer files → DB; new checkpoint dirs → store, then their rows. One fenced
        transaction per call; nothing to write means no transaction."""
        self._upload_new_checkpoints()
        offsets = self.metrics.offset, self.events.offset
        metrics = self.metrics.read()
        events = []
        for event, line_start in self.events.read_with_offsets():
            step = (event.get("data") or {}).get("step")
            if (
                event.get("kind") == "checkpoint"
                and isinstance(step, int)
                and step not in self.uploaded
            ):
                # Its directory appeared after we looked: keep the history in order, stop
                # here and read on from this event once the checkpoint is in the store.
                self.events.offset = line_start
                break
            events.append(event)
        pending = sorted(set(self.uploaded) - self.recorded)
        quality = None if self.quality_reported else self._data_quality()
        if not (metrics or events or pending or quality):
            return
        for m in metrics:
            self.step = max(self.step, int(m["step"]))
        for e in events:
            if e.get("kind") == "started":
                self.total = (e.get("data") or {}).get("total_steps", self.total)

        def write(s: Session) -> None:
            for m in metrics:
                values = {k: v for k, v in m.items() if k != "step"}
                job_states.record_metrics(s, self.job_id, int(m["step"]), values)
            for e in events:
                kind, data = e.get("kind"), dict(e.get("data") or {})
                if kind == "checkpoint":  # recorded here in the history (it is uploaded),
                    step = data.get("step")  # after any earlier one still unrecorded
                    for earlier in sorted(set(self.uploaded) - self.recorded):
                        if isinstance(step, int) and earlier <= step:
                            self._record_checkpoint(s, earlier)
                    continue
                data.pop("path", None)  # local paths mean nothing outside this machine
                data["attempt"] = self.number
                if kind not in _TRAINER_EVENTS:
                    data["trainer_kind"] = kind
                    kind = "log"
                job_states.add_event(s, self.job_id, kind, str(e.get("message", ""))[:2000], data)
            for step in sorted(set(self.uploaded) - self.recorded):
                self._record_checkpoint(s, step)
            if quality:
                mean = quality.get("mean")
                message = "data quality" + (f": mean token log-prob {mean:.3f}" if mean else "")
                job_states.add_event(s, self.job_id, "data_quality", message, quality)

        recorded_before = set(self.recorded)
        try:
            self._fenced(write)
        except BaseException:
            # Rolled back: read and record the same things again next time.
            self.recorded = recorded_before
            self.metrics.offset, self.events.offset = offsets
            raise
        self.quality_reported = self.quality_reported or bool(quality)
        self._prune_local_checkpoints()

    def _record_checkpoint(self, s: Session, step: int) -> None:
        prefix, files, size = self.uploaded[step]
        job_states.add_checkpoint(s, self.job_id, step, prefix, bytes=size, files=files)
        self.recorded.add(step)

    def _local_checkpoints(self) -> list[tuple[int, Path]]:
        root = self.run_dir / "checkpoints"
        if not root.is_dir():
            return []
        found = []
        for p in root.iterdir():  # `step-N` is complete (the trainer renames step-N.tmp)
            m = _STEP_DIR.fullmatch(p.name)
            if m and p.is_dir():
                found.append((int(m.group(1)), p))
        return sorted(found)

    def _upload_new_checkpoints(self, *, required: bool = False) -> None:
        for step, path in self._local_checkpoints():
            if step in self.uploaded:
                continue
            if self.heartbeat.lost.is_set():
                raise LeaseLost(self.job_id)
            prefix = checkpoint_prefix(self.team_id, self.job_id, step)
            try:
                keys = self._upload_dir(prefix, path, attempts=UPLOAD_ATTEMPTS if required else 1)
            except StorageError:
                if required:
                    raise
                self.log.warning("checkpoint upload failed; retrying next time", exc_info=True)
                return  # keep step order: later checkpoints wait for this one
            files = [k[len(prefix) :] for k in keys if not k.endswith("/_COMPLETE")]
            size = sum((path / f).stat().st_size for f in files)
            self.uploaded[step] = (prefix, files, size)

    def _upload_dir(self, prefix: str, path: Path, attempts: int) -> list[str]:
        for i in range(attempts):
            try:
                return self.store.upload_dir(prefix, path)
            except StorageError:
                if i == attempts - 1:
                    raise
                time.sleep(min(10.0, 2.0**i))
        raise AssertionError("unreachable")  # pragma: no cover

    def _prune_local_checkpoints(self) -> None:
        """Recorded checkpoints are safe in the store; keep only the newest on disk (the
        trainer reads a checkpoint only when it starts with --resume)."""
        local = [(step, p) for step, p in self._local_checkpoints() if step in self.recorded]
        for _, path in local[:-1]:
            shutil.rmtree(path, ignore_errors=True)

    # ---- conclude ---------------------------------------------------------------------------
    def conclude(self, rc: int) -> str:
        self._upload_new_checkpoints(required=True)
        self.sync()  # records what the last upload added (and anything written meanwhile)
        last = max(self.recorded, default=None)
        base = {
            "step": self.step,
            "total_steps": self.total,
            "last_checkpoint_step": last,
            "attempt": self.number,
        }
        quality = self._data_quality()
        if quality is not None:  # the histogram is in the data_quality event
            base["data_quality"] = {k: v for k, v in quality.items() if k != "histogram"}
        if rc == EXIT_OK:
            final = self.run_dir / "final"
            if final.is_dir():
                prefix = job_prefix(self.team_id, self.job_id) + "final/"
                keys = self._upload_dir(prefix, final, attempts=UPLOAD_ATTEMPTS)
                base["final_model"] = {
                    "prefix": prefix,
                    "files": [k[len(prefix) :] for k in keys if not k.endswith("/_COMPLETE")],
                }
            return self.finish("succeeded", result=base)
        if rc == EXIT_STOPPED and self.stop_reason == "cancel":
            return self.finish("cancelled", result=base, message=f"cancelled at step {self.step}")
        if rc == EXIT_STOPPED and self.stop_reason == "shutdown":
            return self.release()
        if rc == EXIT_INVALID_SPEC:
            error = stderr_error(self.dir / "stderr.log", rc, self.settings.STDERR_TAIL_BYTES)
            error["type"] = "invalid_spec"
            return self.finish("failed", error=error, result=base)
        error = stderr_error(self.dir / "stderr.log", rc, self.settings.STDERR_TAIL_BYTES)
        if rc == EXIT_STOPPED:
            error["message"] = "the trainer stopped without being asked to"
        return self.finish("failed", error=error, result=base)

    def _data_quality(self) -> dict[str, Any] | None:
        path = self.run_dir / "data_quality.json"
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def finish(self, status: str, *, error=None, result=None, message=None) -> str:
        self.heartbeat.stop()  # no beat may land after the terminal transition

        evaluations: list[str] = []

        def write(s: Session) -> bool:
            done = job_states.finish(
                s, self.job_id, self.worker_id, status, error=error, result=result, message=message
            )
            if done and status == "succeeded":  # same transaction: none can be lost
                evaluations[:] = create_job_evaluations(s, self.job_id)
            return done

        if not self._fenced(write):
            raise LeaseLost(self.job_id)
        self.log.info("%s", status)
        for evaluation_id in evaluations:  # a lost send is re-sent by the reaper's sweep
            try:
                if self.send_evaluation is not None:
                    self.send_evaluation(evaluation_id)
            except Exception:
                self.log.warning("could not send evaluation %s", evaluation_id, exc_info=True)
        return status

    def release(self) -> str:
        """Worker shutdown: the checkpoint is uploaded; give the job back and send it again
        so another worker resumes it now."""
        self.heartbeat.stop()
        if not self._fenced(
            lambda s: job_states.release(s, self.job_id, self.worker_id, "worker shutting down")
        ):
            raise LeaseLost(self.job_id)
        if self.send is not None:
            try:
                self.send(self.job_id)
            except Exception:  # the stale-queued sweep sends it later
                self.log.warning("could not re-send a released job", exc_info=True)
        return "released"


class Runner:
    """Runs job attempts for one worker process (Celery task or embedded thread)."""

    def __init__(
        self,
        settings: WorkerSettings,
        sessions: sessionmaker[Session],
        store: ObjectStore,
        *,
        send: Callable[[str], None] | None = None,
        send_evaluation: Callable[[str], None] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
    ):
        self.settings = settings
        self.sessions = sessions
        self.store = store
        self.send = send
        self.send_evaluation = send_evaluation
        self.should_stop = should_stop

    def run(self, job_id: str) -> str | None:
        """Claim and run one job. Returns None when the job was not ours to run (safe to call
        twice), else how the attempt ended: succeeded, failed, cancelled, released (worker
        shutdown), lost (another worker took over) or abandoned (worker error; retried)."""
        worker_id = new_worker_id()
        with self.sessions() as s:
            job = job_states.claim(s, job_id, worker_id, self.settings.LEASE_SECONDS)
            s.commit()
        if job is None:
            log.info("job %s: not claimable (finished, cancelled or leased); skipping", job_id)
            return None
        log.info("job %s: claimed (attempt %d)", job_id, job.attempt)
        return Attempt(self, job, worker_id).run()
