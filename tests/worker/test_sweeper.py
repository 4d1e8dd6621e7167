"""The storage sweeper (worker.sweeper) on both stores (local directory, SeaweedFS S3) and both
databases (SQLite, PostgreSQL): it removes every orphan a crash can leave (temporary objects
and unfinished multipart uploads, files without a row, outputs of finished or vanished jobs
that no row references) and never an object a row references, one under a job still running,
or one younger than the grace period.

What is left is read from the backend itself (a walk of the directory, S3's own listings),
never through the store methods the sweeper uses.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from models.base import new_id
from models.tables import Checkpoint, Evaluation, Job
from models.teams import create_team
from storage import LocalStore
from storage.keys import checkpoint_prefix, file_key, job_prefix, report_key, upload_key
from tests.faults.orphans import physical
from tests.fixtures.rows import add_file
from tests.worker.conftest import PREFERENCE, wait_for
from worker.sweeper import kind_of, sweep

KiB = 1024


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_store")


def leave_temp(store: Any, size: int) -> list[str]:
    """What a writer SIGKILLed mid-write leaves: a temporary file (local); a temporary object
    and an unfinished multipart upload with one part sent (S3). Returns their physical names."""
    if isinstance(store, LocalStore):
        fd, path = store._temp_file()
        os.write(fd, b"t" * size)
        os.close(fd)
        return [path.relative_to(store.root).as_posix()]
    tmp, upload = store._tmp_key(), store._tmp_key()
    store._client.put_object(Bucket=store.bucket, Key=tmp, Body=b"t" * size)
    uid = store._client.create_multipart_upload(Bucket=store.bucket, Key=upload)["UploadId"]
    store._client.upload_part(
        Bucket=store.bucket, Key=upload, UploadId=uid, PartNumber=1, Body=b"p" * size
    )
    return [tmp, upload + "#upload"]


def checkpoint_dir(root: Path, size: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.bin").write_bytes(b"w" * size)
    (root / "state.json").write_text('{"step": 1}')
    return root


@dataclass
class World:
    """A team's objects after a few crashes: what must stay, and the orphans per kind."""

    keep: set[str] = field(default_factory=set)
    orphans: dict[str, dict[str, int]] = field(
        default_factory=lambda: {"temp": {}, "file": {}, "job": {}}
    )

    def orphan(self, kind: str, store: Any, key: str, size: int) -> None:
        store.put_bytes(key, b"o" * size)
        self.orphans[kind][key] = size


def populate(sessions: Any, store: Any, tmp: Path) -> World:
    w = World()
    with sessions() as s:
        team = create_team(s, f"sweep-{new_id('t')}").id
        kept_file = add_file(s, store, team, PREFERENCE, fmt="preference")
        w.keep.add(kept_file.object_key)

        def job(status: str, **result: Any) -> str:
            row = Job(team_id=team, status=status, spec={}, base_model="tiny-llama",
                      objective="dpo", result=result or None)  # fmt: skip
            s.add(row)
            s.flush()
            return row.id

        def checkpoint(job_id: str, step: int, size: int, *, row: bool) -> set[str]:
            prefix = checkpoint_prefix(team, job_id, step)
            keys = store.upload_dir(prefix, checkpoint_dir(tmp / f"{job_id}-{step}", size))
            if row:
                s.add(Checkpoint(job_id=job_id, step=step, object_prefix=prefix))
            return set(keys)

        # a succeeded job: its recorded checkpoint and final model stay; a stray step does not
        done = job("succeeded")
        final = job_prefix(team, done) + "final/"
        s.get(Job, done).result = {"final_model": {"prefix": final}}  # type: ignore[union-attr]
        w.keep |= checkpoint(done, 2, 3 * KiB, row=True)
        w.keep |= set(store.upload_dir(final, checkpoint_dir(tmp / "final", 2 * KiB)))
        w.orphan("job", store, checkpoint_prefix(team, done, 1) + "model.bin", 5 * KiB)
        # a worker killed mid-checkpoint-upload, then the job cancelled: step 2 is torn
        cancelled = job("cancelled")
        w.keep |= checkpoint(cancelled, 1, 4 * KiB, row=True)
        w.orphan("job", store, checkpoint_prefix(team, cancelled, 2) + "model.bin", 7 * KiB)
        w.orphan("job", store, checkpoint_prefix(team, cancelled, 2) + "state.json", 11)
        # a job still running: its uploaded, not yet recorded checkpoint is its worker's
        w.keep |= checkpoint(job("running"), 3, 2 * KiB, row=False)
        # a job whose row is gone (its team's rows were deleted, say)
        w.orphan("job", store, checkpoint_prefix(team, new_id("job"), 1) + "model.bin", 6 * KiB)
        # reports: a succeeded evaluation's stay, a queued one's may be written any moment,
        # one no evaluation names is an orphan
        evals = []
        for status, job_id in (("succeeded", done), ("queued", None)):
            row = Evaluation(team_id=team, job_id=job_id, kind="math", status=status,
                             base_model=None if job_id else "tiny-llama")  # fmt: skip
            s.add(row)
            s.flush()
            evals.append(row)
        for row in evals:
            owner = row.job_id or row.id
            keys = {n: report_key(team, owner, f"{row.id}.{n}") for n in ("json", "html")}
            for key in keys.values():
                store.put_bytes(key, b"{}")
            w.keep |= set(keys.values())
            if row.status == "succeeded":
                row.result = {"report": keys}
        w.orphan("job", store, report_key(team, cancelled, "eval-gone.json"), 300)
        # the API killed between storing an upload and committing its row
        w.orphan("file", store, file_key(team, new_id("file")), 9 * KiB)
        w.orphan("file", store, upload_key(team, new_id("file")), 1 * KiB)
        s.commit()
    # keys of no shape of ours are not the sweeper's to judge
    for key in ("notes.txt", f"{team}/loose"):
        store.put_bytes(key, b"?")
        w.keep.add(key)
    for name in leave_temp(store, 8 * KiB):
        w.orphans["temp"][name] = 8 * KiB
    return w


def test_a_sweep_removes_every_orphan_and_nothing_a_row_or_a_live_job_needs(
    db_sessions, store, tmp_path
):
    w = populate(db_sessions, store, tmp_path)
    before = physical(store)
    assert set(before) == w.keep | {k for kind in w.orphans.values() for k in kind}
    orphan_bytes = {kind: sum(keys.values()) for kind, keys in w.orphans.items()}

    report = sweep(db_sessions, store, grace_seconds=60, now=time.time() + 120)

    after = physical(store)
    print(
        f"SWEEP {type(store).__name__}: orphan bytes before {sum(orphan_bytes.values())}, "
        f"after {sum(after.values()) - sum(before[k] for k in w.keep)}; {report.as_dict()}"
    )
    assert set(after) == w.keep  # every orphan gone, everything else untouched
    assert {k: after[k] for k in w.keep} == {k: before[k] for k in w.keep}
    for kind, keys in w.orphans.items():
        assert report.removed[kind].objects == len(keys), kind
        assert report.removed[kind].bytes == orphan_bytes[kind], kind
    assert report.young == 0 and report.failed == 0
    # the recorded checkpoints are still complete and readable
    with db_sessions() as s:
        for ckpt in s.execute(select(Checkpoint)).scalars():
            store.download_dir(ckpt.object_prefix, tmp_path / "check" / str(ckpt.id))
    # idempotent: nothing left to remove
    again = sweep(db_sessions, store, grace_seconds=60, now=time.time() + 120)
    assert again.objects == 0 and again.young == 0


def test_orphans_younger_than_the_grace_period_are_kept(db_sessions, store, tmp_path):
    """A write in flight (an upload streaming, a checkpoint being uploaded) is young."""
    w = populate(db_sessions, store, tmp_path)
    before = physical(store)
    report = sweep(db_sessions, store, grace_seconds=3600)
    assert physical(store) == before
    assert report.objects == 0
    assert report.young == sum(len(keys) for keys in w.orphans.values())


def test_a_temp_object_the_store_refuses_to_delete_does_not_stop_the_sweep(
    db_sessions, store, tmp_path, monkeypatch
):
    """A name under .tmp/ that is not ours (the store refuses it: ValueError) is counted as
    failed; every other orphan is still removed."""
    w = populate(db_sessions, store, tmp_path)
    refused = next(n for n in sorted(w.orphans["temp"]) if not n.endswith("#upload"))  # a file
    real = store.delete_temp

    def delete_temp(obj):
        if obj.key.endswith(refused):
            raise ValueError(f"not a temporary object name: {refused!r}")
        return real(obj)

    monkeypatch.setattr(store, "delete_temp", delete_temp)
    report = sweep(db_sessions, store, grace_seconds=60, now=time.time() + 120)
    assert report.failed == 1
    assert set(physical(store)) == w.keep | {k for k in physical(store) if k.endswith(refused)}
    assert report.removed["job"].objects == len(w.orphans["job"])


def test_kind_of_follows_the_key_layout():
    assert kind_of("team-1/files/file-1.jsonl") == "file"
    assert kind_of("team-1/uploads/file-1.jsonl") == "file"
    assert kind_of("team-1/job-1/step-3/model.bin") == "job"
    assert kind_of("team-1/eval-1/reports/eval-1.json") == "job"
    for other in ("notes.txt", "team-1/loose", "a b/job-1/x", "team-1/.hidden/x"):
        assert kind_of(other) is None, other


# --- where it runs ----------------------------------------------------------------------------


def _backdated_orphans(local: Any) -> tuple[Path, Path, Path]:
    """An old orphan file object and an old temporary file, and a young orphan."""
    store = local.store
    old = store.root / file_key(local.team_id, new_id("file"))
    young = store.root / file_key(local.team_id, new_id("file"))
    for path in (old, young):
        store.put_bytes(path.relative_to(store.root).as_posix(), b"x" * 100)
    fd, temp = store._temp_file()
    os.close(fd)
    hour_ago = time.time() - 3600
    for path in (old, temp):
        os.utime(path, (hour_ago, hour_ago))
    return old, temp, young


def test_the_embedded_worker_sweeps_every_sweep_seconds(local):
    from worker import embedded

    settings = local.settings.model_copy(update={"SWEEP_SECONDS": 0.2, "SWEEP_GRACE_SECONDS": 600})
    old, temp, young = _backdated_orphans(local)
    embedded.start(settings)
    try:
        wait_for(lambda: not old.exists() and not temp.exists(), 30, 0.1, "the sweep")
        assert young.exists()
    finally:
        embedded.stop()


def test_celery_beat_sends_the_sweep_task_and_the_task_sweeps(local, monkeypatch):
    from worker import celery_app, tasks

    entry = celery_app.app.conf.beat_schedule["sweep-storage"]
    assert entry["task"] == tasks.sweep_storage.name
    assert entry["task"] in celery_app.app.tasks
    assert entry["schedule"] == celery_app.settings.SWEEP_SECONDS > 0

    class FakeRunner:
        sessions, store = local.sessions, local.store

    monkeypatch.setattr(tasks, "runner", FakeRunner)
    old, temp, young = _backdated_orphans(local)
    result = tasks.sweep_storage.run()
    assert not old.exists() and not temp.exists() and young.exists()
    assert result["file"] == {"objects": 1, "bytes": 100}
    assert result["temp"]["objects"] == 1 and result["young"] == 1
