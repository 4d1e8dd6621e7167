"""What a training attempt downloads before the trainer starts (worker.runner.Attempt.prepare):
the training file, the newest complete checkpoint, and the micro-batch an earlier attempt
ran out of memory with (worker.micro_batch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from contract.runs import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_STATE_FILE,
    CHECKPOINTS_DIR,
    checkpoint_dir_name,
)
from models.tables import Checkpoint, File
from storage import IncompleteCheckpointError, ObjectNotFound
from worker import micro_batch
from worker.attempt import AttemptFailed


class Attempt(Protocol):
    """What the downloads need of a training attempt (worker.runner.Attempt)."""

    sessions: sessionmaker[Session]
    store: Any  # storage.ObjectStore
    job_id: str
    training_file_id: str | None
    run_dir: Path
    resumed_from: int | None  # set here: the step of the checkpoint it resumes from
    progress: Any  # worker.progress.RunProgress: .resumed(step, prefix)
    log: Any

    def warn(self, message: str) -> None: ...


def download_training_file(a: Attempt, dest: Path) -> None:
    with a.sessions() as s:
        row = s.get(File, a.training_file_id) if a.training_file_id else None
        key = row.object_key if row is not None else None
    if key is None:
        raise AttemptFailed("the job's training file was deleted", "missing_file")
    try:
        a.store.download_file(key, dest)
    except ObjectNotFound:
        raise AttemptFailed(
            f"the training file {a.training_file_id} is missing from the store", "missing_file"
        ) from None


def download_checkpoint(a: Attempt) -> int | None:
    """Newest complete checkpoint → run/checkpoints/step-N; returns the world size the resume
    must use: a format 1 checkpoint's own (its optimizer and RNG state are per process), None
    for a sharded DCP checkpoint (it reshards: the attempt places its processes as a fresh one
    would) or when training starts from scratch. A torn one (should not happen: rows follow
    uploads) is skipped for the one before it."""
    with a.sessions() as s:
        rows = s.execute(
            select(Checkpoint.step, Checkpoint.object_prefix)
            .where(Checkpoint.job_id == a.job_id)
            .order_by(Checkpoint.step.desc())
        ).all()
    for step, prefix in rows:
        dest = a.run_dir / CHECKPOINTS_DIR / checkpoint_dir_name(step)
        try:
            a.store.download_dir(prefix, dest, keep_marker=True)  # committed for the trainer
        except IncompleteCheckpointError as exc:
            a.warn(f"checkpoint at step {step} is unusable ({exc}); trying an older one")
            continue
        state = json.loads((dest / CHECKPOINT_STATE_FILE).read_text())
        a.resumed_from = step
        a.progress.resumed(step, prefix)
        a.log.info("resuming from step %d", step)
        if int(state.get("format", 1)) >= CHECKPOINT_FORMAT:
            return None  # DCP reshards to any world size
        return int(state.get("world_size", 1))
    if rows:
        a.warn("no usable checkpoint; training starts from scratch")
    return None


def write_micro_batch(a: Attempt) -> dict[str, int] | None:
    """RUN_DIR/micro_batch.json from the job's newest out_of_memory event (the trainer starts
    with that micro-batch); the record written, or None (none: the trainer chooses)."""
    with a.sessions() as s:
        record = micro_batch.last_record(s, a.job_id)
    if record is not None:
        micro_batch.write(a.run_dir, record)
        a.log.info("starting with %s", micro_batch.describe(record))
    return record
