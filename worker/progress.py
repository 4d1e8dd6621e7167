"""A training run's files into the DB and the store, as the trainer writes them.

RunProgress.sync (every poll of worker.runner.Attempt): new complete checkpoint directories
are uploaded to the store, then the new lines of metrics.jsonl and events.jsonl and the rows of
the uploaded checkpoints are written in one fenced transaction. The history keeps the trainer's
order: a `checkpoint` event whose directory is not uploaded yet holds the events after it back
until it is. A rolled-back write is read and written again next time.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.orm import Session

from contract.runs import (
    CHECKPOINT_EVENT,
    CHECKPOINTS_DIR,
    COPIED_EVENT_KINDS,
    DATA_QUALITY_FILE,
    EVENTS_FILE,
    METRICS_FILE,
    OUT_OF_MEMORY_EVENT,
    checkpoint_step,
)
from models import jobs as job_states
from storage import COMPLETE_MARKER, StorageError
from storage.keys import checkpoint_prefix
from worker.attempt import MAX_MESSAGE_CHARS, LeaseLost
from worker.micro_batch import record_of
from worker.tail import JsonlTail


class RunOwner(Protocol):
    """What RunProgress needs of whoever follows the run: worker.runner.Attempt (a local
    run directory), worker.reconcile.JobTick (a multi-node attempt's run log, mirrored)."""

    run_dir: Path
    store: Any
    job_id: str
    team_id: str
    number: int
    log: Any
    heartbeat: Any  # .lost: an Event set when the lease is gone

    def fenced(self, write: Callable[[Session], Any]) -> Any: ...
    def public(self, value: Any) -> Any: ...


UPLOAD_ATTEMPTS = 3
# The trainer's out_of_memory events keep their kind (worker.micro_batch finds the newest
# one, the API's job object shows it); every other kind not in the contract's list is a `log`.


class RunProgress:
    def __init__(self, attempt: RunOwner, step: int, total: int | None):
        self.a = attempt
        self.step = step
        self.total = total
        self.metrics = JsonlTail(attempt.run_dir / METRICS_FILE)
        self.events = JsonlTail(attempt.run_dir / EVENTS_FILE)
        self.uploaded: dict[int, tuple[str, list[str], int]] = {}  # step → prefix, files, bytes
        self.recorded: set[int] = set()
        self.quality_reported = False
        self.started = False  # the trainer's `started` event: its first step is under way
        self.started_data: dict[str, Any] | None = None  # its data (the memory it counted on)
        self.out_of_memory: dict[str, int] | None = None  # this attempt's newest, recorded

    def resumed(self, step: int, prefix: str) -> None:
        """The attempt starts from the stored checkpoint at `step`."""
        self.step = step
        self.uploaded[step] = (prefix, [], 0)
        self.recorded.add(step)

    def data_quality(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.a.run_dir / DATA_QUALITY_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def sync(self) -> None:
        """Trainer files → DB; new checkpoint dirs → store, then their rows. One fenced
        transaction per call; nothing to write means no transaction."""
        self.upload_new_checkpoints()
        offsets = self.metrics.offset, self.events.offset
        metrics = self.metrics.read()
        events = []
        for event, line_start in self.events.read_with_offsets():
            step = (event.get("data") or {}).get("step")
            kind = event.get("kind")
            if kind == CHECKPOINT_EVENT and isinstance(step, int) and step not in self.uploaded:
                # Its directory appeared after we looked: keep the history in order, stop
                # here and read on from this event once the checkpoint is in the store.
                self.events.offset = line_start
                break
            events.append(event)
        pending = sorted(set(self.uploaded) - self.recorded)
        quality = None if self.quality_reported else self.data_quality()
        if not (metrics or events or pending or quality):
            return
        for m in metrics:
            self.step = max(self.step, int(m["step"]))
        for e in events:
            data = e.get("data") or {}
            if e.get("kind") == "started":
                self.started = True
                self.started_data = data
                self.total = data.get("total_steps", self.total)
            if isinstance(data.get("step"), int):  # metrics are logged every log_every steps;
                self.step = max(self.step, data["step"])  # a checkpoint or stop says its step

        recorded_before = set(self.recorded)
        try:
            self.a.fenced(lambda s: self._write(s, metrics, events, quality))
        except BaseException:
            # Rolled back: read and record the same things again next time.
            self.recorded = recorded_before
            self.metrics.offset, self.events.offset = offsets
            raise
        self.quality_reported = self.quality_reported or bool(quality)
        for e in events:  # recorded now (the transaction committed)
            if e.get("kind") == OUT_OF_MEMORY_EVENT:
                self.out_of_memory = record_of(e.get("data")) or self.out_of_memory
        self._prune_local_checkpoints()

    def _write(self, s: Session, metrics: list, events: list, quality: dict | None) -> None:
        job_id = self.a.job_id
        for m in metrics:
            values = {k: v for k, v in m.items() if k != "step"}
            job_states.record_metrics(s, job_id, int(m["step"]), values)
        for e in events:
            kind, data = e.get("kind"), dict(e.get("data") or {})
            if kind == CHECKPOINT_EVENT:  # recorded here in the history (it is uploaded),
                step = data.get("step")  # after any earlier one still unrecorded
                for earlier in sorted(set(self.uploaded) - self.recorded):
                    if isinstance(step, int) and earlier <= step:
                        self._record_checkpoint(s, earlier)
                continue
            data = self.a.public(data)  # no local path, host name or pid (worker.scrub)
            data["attempt"] = self.a.number
            if kind not in COPIED_EVENT_KINDS:
                data["trainer_kind"] = kind
                kind = "log"
            message = self.a.public(str(e.get("message", ""))[:MAX_MESSAGE_CHARS])
            job_states.add_event(s, job_id, str(kind), message, data)
        for step in sorted(set(self.uploaded) - self.recorded):
            self._record_checkpoint(s, step)
        if quality:
            mean = quality.get("mean")
            message = "data quality" + (f": mean token log-prob {mean:.3f}" if mean else "")
            job_states.add_event(s, job_id, "data_quality", message, quality)

    def _record_checkpoint(self, s: Session, step: int) -> None:
        prefix, files, size = self.uploaded[step]
        job_states.add_checkpoint(s, self.a.job_id, step, prefix, bytes=size, files=files)
        self.recorded.add(step)

    def _local_checkpoints(self) -> list[tuple[int, Path]]:
        root = self.a.run_dir / CHECKPOINTS_DIR
        if not root.is_dir():
            return []
        found = []
        for p in root.iterdir():  # `step-N` is complete once the trainer wrote its marker
            step = checkpoint_step(p.name)
            if step is not None and (p / COMPLETE_MARKER).is_file():
                found.append((step, p))
        return sorted(found)

    def upload_new_checkpoints(self, *, required: bool = False) -> None:
        for step, path in self._local_checkpoints():
            if step in self.uploaded:
                continue
            if self.a.heartbeat.lost.is_set():
                raise LeaseLost(self.a.job_id)
            prefix = checkpoint_prefix(self.a.team_id, self.a.job_id, step)
            try:
                files = self.upload_dir(prefix, path, attempts=UPLOAD_ATTEMPTS if required else 1)
            except StorageError:
                if required:
                    raise
                self.a.log.warning("checkpoint upload failed; retrying next time", exc_info=True)
                return  # keep step order: later checkpoints wait for this one
            size = sum((path / f).stat().st_size for f in files)
            self.uploaded[step] = (prefix, files, size)

    def upload_dir(self, prefix: str, path: Path, attempts: int) -> list[str]:
        """Upload `path` to the directory `prefix` (retried up to `attempts` times); the names
        of its files under `prefix`, the completion marker left out."""
        for i in range(attempts):
            try:
                keys = self.a.store.upload_dir(prefix, path)
                return [k[len(prefix) :] for k in keys if not k.endswith("/" + COMPLETE_MARKER)]
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
