"""One leased attempt at one unit of work, whatever the work: claim → prepare → subprocess →
tail → conclude. Training (worker.runner) and evaluation (worker.evaluate) supply the parts
that differ; the life cycle, the lease and the child process are here, once.

    claim       claim_and_run: a guarded UPDATE (models.leases); losing it (a duplicate
                delivery, the row finished, leased by a live worker) returns None at once.
    prepare     (the work) download what the child needs; returns its Launch (argv, env).
    subprocess  the child in its own process group, killed with us (PR_SET_PDEATHSIG) and
                by killpg when the attempt ends however it ends.
    tail        every poll_seconds: on_poll() (the work copies the child's files into the DB);
                the lease's status `cancelling`, or a worker shutdown, → request_stop().
    conclude    (the work) from the child's exit code: finish (succeeded, failed, cancelled)
                or release (back to the queue, a worker shutdown).

The lease (models.leases): a Heartbeat thread renews it every `heartbeat_seconds` while the
main thread is busy (downloads, uploads, the child). Every DB write of a running attempt goes
through `fenced`: one transaction with a renew, so once the lease is lost (the reaper requeued
the row, another worker reclaimed it) the renew matches no row, the transaction is rolled
back and the attempt stops as "lost" without writing anything.

Outcomes of run(): the work's own (succeeded, failed, cancelled, released), `lost`, or
`abandoned`: our machinery failed (the store, the DB); the attempt stops heart-beating, the
lease expires and the reaper queues the row again (up to MAX_JOB_ATTEMPTS times).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from worker.config import WorkerSettings, new_worker_id
from worker.scrub import Server, error_tail, scrub, this_server
from worker.warm import Child
from worker.warm import can_start as can_start_warm
from worker.warm import start as start_warm

log = logging.getLogger("humanline.worker")

# The most of a message a team reads in an error or an event (the child's own words can be
# long; the whole of them stays in the attempt's logs), and the log file of the child's stderr
# in the attempt's directory (read back by stderr_tail for a failure's details).
MAX_MESSAGE_CHARS = 2000
STDERR_LOG = "stderr.log"


class AttemptFailed(Exception):
    """A failure of the work itself (bad data, bad spec, a crash of the child): it fails."""

    def __init__(self, message: str, type: str = "error", **details: Any):
        super().__init__(message)
        self.error = {"type": type, "message": message, **details}


class LeaseLost(Exception):
    """Another attempt owns the row now: stop without writing anything."""


@dataclass
class Launch:
    """How to start the child: argv and environment; `deathsig` reaches it if we die (a
    launcher of several ranks gets SIGTERM so it can stop them)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    deathsig: int = signal.SIGKILL
    warm: bool = False  # forked from the warm process (worker.warm) when it can be


# --- the child process -------------------------------------------------------------------------


def die_with_parent(sig: int) -> Callable[[], None] | None:
    """A preexec_fn that makes the child get `sig` when the thread that started it dies
    (Linux PR_SET_PDEATHSIG), so a SIGKILLed worker cannot leave its child running. Everything
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


def kill_group(proc: Child | None) -> None:
    """SIGKILL the child's whole process group (accelerate's ranks included)."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def stderr_tail(path: Path, limit: int, server: Server) -> tuple[str, str]:
    """(the last lines of the last `limit` bytes of a child's stderr, scrubbed for a team to
    read (worker.scrub.error_tail); its last line). The whole file stays in the attempt's
    directory for operators."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - limit))
            tail = error_tail(fh.read().decode("utf-8", "replace"), server)
    except OSError:
        tail = ""
    lines = [ln.strip() for ln in re.split(r"[\r\n]+", tail) if ln.strip()]
    return tail, lines[-1] if lines else ""


def crash_error(
    child: str, type: str, path: Path, rc: int, limit: int, server: Server | None = None
) -> dict[str, Any]:
    """The error of a child (`child`: "the trainer") that exited with `rc` without writing
    its own: the exit code (or signal) and the last line of its stderr as the message, the
    scrubbed tail of `path` as details (`server`: by default this machine seen from the
    attempt's directory, where the stderr log is)."""
    tail, last = stderr_tail(path, limit, server or this_server(path.parent))
    if rc < 0:
        message = f"{child} was killed by signal {-rc}"
    else:
        message = f"{child} exited with code {rc}" + (f": {last}" if last else "")
    message = message[:MAX_MESSAGE_CHARS]
    return {"type": type, "message": message, "exit_code": rc, "stderr_tail": tail}


# --- the lease ---------------------------------------------------------------------------------


class Heartbeat(threading.Thread):
    """Renews the lease in the background; sets `lost` when it is gone."""

    def __init__(self, attempt: LeasedAttempt):
        super().__init__(name=f"heartbeat-{attempt.row_id}", daemon=True)
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


class _Prefixed(logging.LoggerAdapter):
    """Prefixes "job <id>: " (Celery's log format shows no `extra`)."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        return f"{self.extra['what']}: {msg}", kwargs  # type: ignore[index]


# --- one attempt -------------------------------------------------------------------------------


class LeasedAttempt:
    """The life cycle. A kind of work subclasses it and supplies renew, prepare, conclude and
    fail (and, if it wants, before_start, on_poll, request_stop)."""

    kind = "work"  # "job", "evaluation": logs and the scratch directory

    def __init__(
        self, settings: WorkerSettings, sessions: sessionmaker[Session], *, row_id: str,
        worker_id: str, number: int, should_stop: Callable[[], bool] = lambda: False,
        scratch: Path | None = None,
    ):  # fmt: skip
        self.settings, self.sessions, self.should_stop = settings, sessions, should_stop
        self.row_id, self.worker_id, self.number = row_id, worker_id, number
        root = scratch or Path(settings.WORKER_DIR).resolve() / row_id
        self.dir = root / f"attempt-{number}-{worker_id.rsplit(':', 1)[-1]}"
        self.status = "running"
        self.stop_reason: str | None = None
        self.stop_asked_at = 0.0
        self.killed = False  # we killed the child after asking it to stop (no checkpoint then)
        self.proc: Child | None = None
        self.heartbeat = Heartbeat(self)
        self.log = _Prefixed(log, {"what": f"{self.kind} {row_id}"})

    # ---- supplied by the work -------------------------------------------------------------------
    def renew(self, s: Session) -> str | None:
        """Extend the lease (recording progress); the status, or None when it is lost."""
        raise NotImplementedError

    def prepare(self) -> Launch:
        raise NotImplementedError

    def conclude(self, rc: int) -> str:
        raise NotImplementedError

    def fail(self, error: dict[str, Any]) -> str:
        raise NotImplementedError

    def before_start(self) -> str | None:
        """An outcome that ends the attempt before the child starts (None: start it)."""
        return self.release() if self.should_stop() else None

    def on_poll(self) -> None:
        """Called every poll while the child runs, and once after it exited."""

    def request_stop(self, reason: str) -> None:
        """Ask the child to stop ("cancel" or "shutdown"); by default it is killed."""
        kill_group(self.proc)

    def stop_wanted(self) -> str | None:
        """Why the child should stop now: "cancel" (the row is `cancelling`), "shutdown" (the
        worker's), or None."""
        if self.status == "cancelling":
            return "cancel"
        return "shutdown" if self.should_stop() else None

    def release(self) -> str:
        raise NotImplementedError

    # ---- the lease ------------------------------------------------------------------------------
    def beat(self, s: Session) -> str:
        status = self.renew(s)
        if status is None:
            raise LeaseLost(self.row_id)
        self.status = status
        return status

    def fenced(self, write: Callable[[Session], Any]) -> Any:
        """Run `write` in one transaction with a renew: all of it lands only while we still
        hold the lease."""
        with self.sessions() as s:
            try:
                self.beat(s)
                out = write(s)
                s.commit()
                return out
            except BaseException:
                s.rollback()
                raise

    def end(self, write: Callable[[Session], bool]) -> None:
        """The last write of the attempt (finish, release): no beat may land after it."""
        self.heartbeat.stop()
        if not self.fenced(write):
            raise LeaseLost(self.row_id)

    def warn(self, message: str) -> None:
        """Best effort: a note of our own trouble (the DB may be the thing that failed)."""
        self.log.warning("%s", message)

    def server(self) -> Server:
        """What identifies this machine in the attempt's words (worker.scrub)."""
        return this_server(self.dir, pids=[self.proc.pid if self.proc else None])

    def crash(self, rc: int, child: str, type: str) -> dict[str, Any]:
        """crash_error for this attempt's child, from its stderr log here."""
        path, limit = self.dir / STDERR_LOG, self.settings.STDERR_TAIL_BYTES
        return crash_error(child, type, path, rc, limit, self.server())

    def public(self, value: Any) -> Any:
        """`value` (an error, a message, an event's data) as a team may read it: without
        this machine's paths, host name or pids. Every team-visible write passes here."""
        return scrub(value, self.server())

    # ---- the whole attempt ----------------------------------------------------------------------
    def run(self) -> str:
        self.heartbeat.start()
        try:
            try:
                for old in self.dir.parent.glob("attempt-*"):  # earlier attempts on this machine
                    shutil.rmtree(old, ignore_errors=True)
                self.dir.mkdir(parents=True)
                launch = self.prepare()
                early = self.before_start()
                if early is not None:
                    return early
                return self.conclude(self.supervise(launch))
            except AttemptFailed as exc:
                self.log.warning("failed: %s", exc)
                return self.fail(exc.error)
        except LeaseLost:
            self.log.warning("lease lost; stopping this attempt")
            return "lost"
        except Exception as exc:  # our machinery failed (store, DB): the reaper retries
            self.log.exception("attempt failed; it is retried after its lease expires")
            # Its type only: the text of a store's or database's error names their hosts.
            self.warn(f"worker error ({type(exc).__name__}), retrying after the lease expires")
            return "abandoned"
        finally:
            kill_group(self.proc)
            self.heartbeat.stop()
            if not self.settings.KEEP_RUN_DIRS:
                shutil.rmtree(self.dir, ignore_errors=True)
                with contextlib.suppress(OSError):  # the row's own directory, once empty
                    self.dir.parent.rmdir()

    def start_child(self, launch: Launch) -> Child:
        """The child, in its own session (killpg reaches every rank), its output in the
        attempt's files; forked from the warm process (worker.warm) where the launch asks."""
        warm = launch.warm and can_start_warm(launch.argv)
        self.log.info("starting%s: %s", " (warm)" if warm else "", " ".join(launch.argv))
        out, err = self.dir / "stdout.log", self.dir / STDERR_LOG
        if warm:
            out.write_bytes(b"")
            err.write_bytes(b"")
            return start_warm(launch.argv, env=launch.env, cwd=self.dir, stdout=out,
                              stderr=err, deathsig=launch.deathsig)  # fmt: skip
        with open(out, "wb") as out_fh, open(err, "wb") as err_fh:
            return subprocess.Popen(
                launch.argv,
                stdin=subprocess.DEVNULL,
                stdout=out_fh,
                stderr=err_fh,
                env=launch.env,
                cwd=self.dir,
                start_new_session=True,
                # Safe with threads: it makes two plain libc calls prepared before the fork.
                preexec_fn=die_with_parent(launch.deathsig),  # noqa: PLW1509
            )

    def supervise(self, launch: Launch) -> int:
        """Start the child, tail it until it exits; its exit code."""
        self.proc = self.start_child(launch)
        while True:
            rc = self.proc.poll()
            self.on_poll()  # after poll(): once it has exited, this sees all its output
            if rc is not None:
                return rc
            if self.heartbeat.lost.is_set():
                raise LeaseLost(self.row_id)
            if self.stop_reason is None:
                reason = self.stop_wanted()
                if reason is not None:
                    self.stop_reason = reason
                    self.stop_asked_at = time.monotonic()
                    self.log.info("asking the child to stop (%s)", reason)
                    self.request_stop(reason)
            elif time.monotonic() - self.stop_asked_at > self.settings.STOP_GRACE_SECONDS:
                # no step boundary in sight: stop it anyway (its last checkpoint is kept)
                self.log.warning("the child did not stop within STOP_GRACE_SECONDS; killing it")
                self.killed = True
                kill_group(self.proc)
            try:
                self.proc.wait(timeout=self.settings.WORKER_POLL_SECONDS)
            except subprocess.TimeoutExpired:
                pass


def claim_and_run(
    kind: str,
    sessions: sessionmaker[Session],
    claim: Callable[[Session, str, str, float], Any],
    start: Callable[[Any, str], Any],  # a LeasedAttempt, or anything with run() -> str
    row_id: str,
    lease_seconds: float,
) -> str | None:
    """Claim `row_id` for a new worker id and run one attempt at it. None when it was not
    ours to run (safe to call twice), else how the attempt ended."""
    worker_id = new_worker_id()
    with sessions() as s:
        row = claim(s, row_id, worker_id, lease_seconds)
        s.commit()
    if row is None:
        log.info("%s %s: not claimable (finished or leased); skipping", kind, row_id)
        return None
    # The whole owner (host:pid:random) is for operators: events name only its random part.
    log.info("%s %s: claimed (attempt %d) by %s", kind, row_id, row.attempt, worker_id)
    return start(row, worker_id).run()
