"""The sweeper: removes from the object store what crashes leave behind, and nothing else
(DESIGN.md §6: "crashes leave nothing behind that a sweeper does not remove").

What it removes, each kind only once older than the grace period (SWEEP_GRACE_SECONDS):

    temp    temporary objects of writes that never finished: `.tmp/` files or objects, and
            unfinished S3 multipart uploads (a process killed mid-upload: the API receiving
            a file, a worker uploading a checkpoint)
    file    `{team}/files/*` and `{team}/uploads/*` that no file row names (the API killed
            between storing an upload and committing its row; a failed delete)
    job     `{team}/{owner}/...` (checkpoints, final model, reports) whose job or evaluation
            is gone or finished and that no row references: a checkpoint prefix without its
            checkpoint row (a worker killed mid-upload, then the job cancelled), a final
            model the job's result does not name, a report no evaluation names

What it keeps, whatever its age: every key a row references (File.object_key,
Checkpoint.object_prefix, Job.result.final_model.prefix, Evaluation.result.report), and
everything under a job that is still active (validating, queued, running, cancelling: its
worker may write there and record it later) or named as the report of an evaluation still
queued or running. A key of any other shape is not ours to judge and is left alone.

The grace period protects writes in flight: a temporary object is renewed by every block or
part written, an object is published moments before its row is committed. It must exceed
the longest such pause (default 1 h). The sweep is idempotent and safe to run in several
processes at once (deleting a missing key is a no-op). It runs in the embedded worker
(worker.embedded) and as the Celery beat task `worker.tasks.sweep_storage`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from models.db import session_scope
from models.tables import TERMINAL_STATUSES, Checkpoint, Evaluation, File, Job
from storage import ObjectInfo, ObjectStore, StorageError
from storage.keys import ID_PATTERN

log = logging.getLogger("humanline.worker.sweeper")

KINDS = ("temp", "file", "job")
_FILE_NAMESPACES = ("files", "uploads")
_ACTIVE_EVALUATIONS = ("queued", "running")


@dataclass
class Removed:
    objects: int = 0
    bytes: int = 0

    def add(self, obj: ObjectInfo) -> None:
        self.objects += 1
        self.bytes += obj.size


@dataclass
class SweepReport:
    """What one sweep removed, per kind; `young`: orphans kept because they are younger than
    the grace period (a write may still be in flight); `failed`: deletes that raised."""

    removed: dict[str, Removed] = field(default_factory=lambda: {k: Removed() for k in KINDS})
    young: int = 0
    failed: int = 0

    @property
    def objects(self) -> int:
        return sum(r.objects for r in self.removed.values())

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.removed.values())

    def as_dict(self) -> dict[str, Any]:
        kinds = {k: {"objects": r.objects, "bytes": r.bytes} for k, r in self.removed.items()}
        return {**kinds, "young": self.young, "failed": self.failed}


@dataclass
class References:
    """What the database says must stay: exact keys, directory prefixes ("a/b/step-3/"), and
    owners ("{team}/{id}/") whose whole directory stays because their work is not finished."""

    keys: set[str] = field(default_factory=set)
    prefixes: set[str] = field(default_factory=set)
    active_owners: set[str] = field(default_factory=set)

    def keeps(self, key: str) -> bool:
        if key in self.keys:
            return True
        parts = key.split("/")
        dirs = ("/".join(parts[:i]) + "/" for i in range(1, len(parts)))
        return any(d in self.prefixes or d in self.active_owners for d in dirs)


def load_references(session: Session) -> References:
    """Every key and prefix a row references. Jobs are read first: a job seen finished has
    committed its checkpoint rows before, so the later read of those sees them all."""
    refs = References()
    jobs = session.execute(select(Job.team_id, Job.id, Job.status, Job.result)).all()
    for team_id, job_id, status, result in jobs:
        if status not in TERMINAL_STATUSES:
            refs.active_owners.add(f"{team_id}/{job_id}/")
        final = _get(result, "final_model", "prefix")
        if isinstance(final, str):
            refs.prefixes.add(final)
    refs.prefixes.update(session.scalars(select(Checkpoint.object_prefix)))
    refs.keys.update(session.scalars(select(File.object_key)))
    evals = session.execute(
        select(Evaluation.team_id, Evaluation.id, Evaluation.job_id, Evaluation.status,
               Evaluation.result)
    )  # fmt: skip
    for team_id, eval_id, job_id, status, result in evals:
        report = _get(result, "report")
        if isinstance(report, dict):
            refs.keys.update(v for v in report.values() if isinstance(v, str))
        if status in _ACTIVE_EVALUATIONS:  # its worker writes these, then records them
            owner = f"{team_id}/{job_id or eval_id}/reports/{eval_id}"
            refs.keys.update({f"{owner}.json", f"{owner}.html"})
    return refs


def _get(doc: Any, *path: str) -> Any:
    for name in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(name)
    return doc


def kind_of(key: str) -> str | None:
    """The kind ("file" or "job") of a key of the storage.keys layout; None for any other."""
    parts = key.split("/")
    if len(parts) < 3 or ID_PATTERN.fullmatch(parts[0]) is None:
        return None
    if parts[1] in _FILE_NAMESPACES:
        return "file"
    if ID_PATTERN.fullmatch(parts[1]) is not None:
        return "job"
    return None


def find_orphans(store: ObjectStore, refs: References) -> list[tuple[str, ObjectInfo]]:
    """(kind, object) of every object no row keeps, whatever its age (temporary objects
    included: nothing references them)."""
    found = [("temp", obj) for obj in store.scan_temp()]
    for obj in store.scan(""):
        kind = kind_of(obj.key)
        if kind is not None and not refs.keeps(obj.key):
            found.append((kind, obj))
    return found


def sweep(
    sessions: sessionmaker[Session],
    store: ObjectStore,
    *,
    grace_seconds: float,
    now: float | None = None,
) -> SweepReport:
    """One sweep: remove the orphans last written more than `grace_seconds` before `now`.

    The references are read before the store is listed, so an object written after that
    read is at most moments old when listed: the grace period keeps it."""
    with session_scope(sessions) as s:
        refs = load_references(s)
    cutoff = (time.time() if now is None else now) - grace_seconds
    report = SweepReport()
    for kind, obj in find_orphans(store, refs):
        if obj.modified >= cutoff:
            report.young += 1
            continue
        try:
            if kind == "temp":
                store.delete_temp(obj)
            else:
                store.delete(obj.key)
        except (StorageError, ValueError):  # ValueError: a temp name the store refuses
            report.failed += 1
            log.warning("sweep: could not delete %s object %r", kind, obj.key, exc_info=True)
            continue
        report.removed[kind].add(obj)
    if report.objects or report.failed:
        log.warning("sweep removed orphaned objects: %s", report.as_dict())
    return report


class StoreSweeper:
    """A sweep bound to its database and store: what the embedded worker's thread and the
    Celery task call."""

    def __init__(
        self, sessions: sessionmaker[Session], store: ObjectStore, grace_seconds: float
    ) -> None:
        self.sessions = sessions
        self.store = store
        self.grace_seconds = grace_seconds

    def __call__(self) -> SweepReport:
        return sweep(self.sessions, self.store, grace_seconds=self.grace_seconds)
