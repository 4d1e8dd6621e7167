"""Processes SIGKILLed mid-write on the real stack (DESIGN.md §6): a uvicorn API process under a
burst of creates while an upload streams in (S3 and local store), and a worker mid-checkpoint-
upload, its job then cancelled. Nothing a client was told exists is lost, and after each kill
one sweep (worker.sweeper) leaves zero orphaned bytes, measured from the backend against the
rows (tests.faults.orphans).

Marked slow (`pytest -m slow`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter

import httpx
import pytest
from sqlalchemy import select

from models import jobs as job_states
from models.db import session_scope
from models.tables import Checkpoint, File, Job
from storage import LocalStore
from tests.faults.orphans import physical, sweep_later, temp_bytes
from tests.fixtures.live import free_port
from tests.fixtures.services import REPO, wait_for
from tests.worker.conftest import PREFERENCE, TINY, checkpoint_steps, jsonl

pytestmark = [pytest.mark.slow, pytest.mark.faults]
MiB = 1 << 20


# --- the API process SIGKILLed ---------------------------------------------------------------


class SlowUpload:
    """A multipart upload of a valid training file that streams 12 MiB at once, then a line
    every 0.1 s until the connection breaks: in flight, with bytes stored, at the kill."""

    boundary = "sweep-fault-boundary"

    def __init__(self, base: str, auth: dict[str, str]):
        self.base, self.auth = base, auth
        self.sent = 0
        self.outcome: str | None = None

    def body(self):
        b = self.boundary
        yield (
            f'--{b}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\ntrain\r\n'
            f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
            "Content-Type: application/jsonl\r\n\r\n"
        ).encode()
        line = PREFERENCE.splitlines(keepends=True)[0]
        while True:
            yield PREFERENCE if self.sent < 12 * MiB else line
            self.sent += len(PREFERENCE) if self.sent < 12 * MiB else len(line)
            if self.sent >= 12 * MiB:
                time.sleep(0.1)

    def run(self) -> None:
        b = self.boundary
        try:
            r = httpx.post(
                f"{self.base}/v1/files",
                headers={**self.auth, "Content-Type": f"multipart/form-data; boundary={b}"},
                content=self.body(),
                timeout=httpx.Timeout(10, read=120),
            )
            self.outcome = str(r.status_code)
        except httpx.HTTPError as exc:
            self.outcome = type(exc).__name__


@pytest.mark.parametrize("backend", ["s3", "local"])
def test_api_process_killed_mid_burst_loses_nothing(stack, s3_server, db_url, tmp_path, backend):
    """uvicorn (a real process) SIGKILLed while 40 creates with Idempotency-Keys and an upload
    that is still streaming (12 MiB already stored) are in flight; restarted, every key is
    retried: each yields exactly one job, and every file row has its object. The cut upload
    left orphaned bytes (a temporary file, or an S3 multipart upload), and a handful of small
    uploads may have been killed between their put and their commit: one sweep removes every
    orphaned byte and no file a row names."""
    port = free_port()
    env = {
        **os.environ,
        **{k: v for k, v in stack.env.items() if k.isupper()},
        "PYTHONPATH": str(REPO),
        "LOG_LEVEL": "WARNING",
    }
    store = stack.store
    if backend == "local":
        env["STORAGE_URL"] = f"file://{tmp_path / 'objects'}"
        store = LocalStore(tmp_path / "objects")
    key = stack.headers["Authorization"].removeprefix("Bearer ")
    base = f"http://127.0.0.1:{port}"

    def serve() -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "serve", "--port", str(port), "--no-migrate"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

        def up() -> bool:
            try:
                return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                assert proc.poll() is None, "uvicorn exited"
                return False

        wait_for(up, 30, 0.2, "uvicorn")
        return proc

    proc = serve()
    auth = {"Authorization": f"Bearer {key}"}
    r = httpx.post(
        f"{base}/v1/files",
        headers=auth,
        files={"file": ("train.jsonl", PREFERENCE, "application/jsonl")},
        data={"purpose": "train"},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    file_id = r.json()["id"]
    for _ in range(3):  # warm: connections pooled, routes imported
        assert httpx.get(f"{base}/v1/jobs", headers=auth, timeout=30).status_code == 200
    import threading

    results: dict[str, int] = {}

    def create(i: int) -> None:
        time.sleep(i * 0.05)  # spread over 2 s: some finish, some are cut, some refused
        try:
            r = httpx.post(
                f"{base}/v1/jobs",
                headers={**auth, "Idempotency-Key": f"kill-{i}"},
                json={**TINY, "training_file": file_id, "max_steps": 1},
                timeout=10,
            )
            results[f"kill-{i}"] = r.status_code
        except httpx.HTTPError as exc:
            results[f"kill-{i}"] = type(exc).__name__

    def upload(i: int) -> None:
        try:
            httpx.post(
                f"{base}/v1/files",
                headers=auth,
                files={"file": (f"u{i}.jsonl", PREFERENCE * 20, "application/jsonl")},
                data={"purpose": "train"},
                timeout=10,
            )
        except httpx.HTTPError:
            pass

    slow = SlowUpload(base, auth)
    slow_thread = threading.Thread(target=slow.run)
    slow_thread.start()
    # the upload is in flight and has bytes in the store: a temporary file, or parts
    wait_for(lambda: temp_bytes(store) >= 8 * MiB, 120, 0.1, "the slow upload to be stored")
    threads = [threading.Thread(target=create, args=(i,)) for i in range(40)]
    threads += [threading.Thread(target=upload, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    assert slow.outcome is None, f"the slow upload ended before the kill: {slow.outcome}"
    proc.kill()  # SIGKILL: no shutdown, no cleanup
    proc.wait(10)
    for t in [*threads, slow_thread]:
        t.join(20)
    proc = serve()
    try:
        ids = {}
        for i in range(40):
            r = httpx.post(
                f"{base}/v1/jobs",
                headers={**auth, "Idempotency-Key": f"kill-{i}"},
                json={**TINY, "training_file": file_id, "max_steps": 1},
                timeout=30,
            )
            assert r.status_code in (201, 429), r.text  # 429: the team's active-job limit
            if r.status_code == 201:
                ids[f"kill-{i}"] = r.json()["id"]
        with stack.sessions() as s:
            rows = s.execute(select(Job.id)).scalars().all()
            file_keys = set(s.scalars(select(File.object_key)))
        assert len(rows) == len(set(rows)) and set(ids.values()) <= set(rows)
        assert len(rows) == len(ids), "a killed request left a job without its key"
        figures = sweep_later(stack.sessions, store)
        print(
            f"API-KILL ({backend}) "
            + json.dumps(
                {
                    "first_try": Counter(results.values()),
                    "slow_upload": slow.outcome,
                    "jobs": len(rows),
                    **figures,
                }
            )
        )
        assert figures["orphaned_bytes_before_sweep"] >= 8 * MiB  # the cut upload's bytes
        assert figures["orphaned_bytes_after_sweep"] == 0, figures["orphans_after"]
        # every file row still has its object (a client never sees a file it cannot read)
        stored = physical(store)
        assert file_keys and all(k in stored for k in file_keys), (file_keys, sorted(stored))
        files = httpx.get(f"{base}/v1/files", headers=auth, params={"limit": 100}, timeout=10)
        for f in files.json()["data"]:
            got = httpx.get(f"{base}/v1/files/{f['id']}/content", headers=auth, timeout=30)
            assert got.status_code == 200 and len(got.content) == f["bytes"], f
    finally:
        proc.kill()
        proc.wait(10)


# --- a worker SIGKILLed mid-checkpoint-upload, then its job cancelled --------------------------


def _torn_checkpoints(store, job_id: str) -> set[str]:
    """step-N/ prefixes of the job with objects but no `_COMPLETE` (an upload in flight)."""
    prefixes: dict[str, set[str]] = {}
    for key in physical(store):
        m = re.match(rf"[^/]+/{job_id}/(step-\d+)/(.+)$", key)
        if m:
            prefixes.setdefault(m.group(1), set()).add(m.group(2))
    return {p for p, names in prefixes.items() if "_COMPLETE" not in names}


def test_worker_killed_mid_checkpoint_upload_then_cancelled_leaves_no_orphan_after_a_sweep(
    stack, celery_workers, tmp_path
):
    """A worker whose checkpoint uploads are slowed (tests/faults/slow_put: 2 s before each
    file) is SIGKILLed while a checkpoint is half uploaded (some files, no `_COMPLETE`, no
    row); the job is cancelled, and with no worker left the reaper ends it `cancelled` when
    its lease lapses. The torn checkpoint is orphaned; one sweep removes it, and every
    checkpoint a row names stays complete."""
    env = {
        **stack.env,
        "PYTHONPATH": f"{REPO / 'tests' / 'faults' / 'slow_put'}{os.pathsep}{REPO}",
        "HUMANLINE_TEST_SLOW_CHECKPOINT_PUT_S": "2",
    }
    worker = celery_workers.start(env, name="ckpt")
    file_id = stack.upload(jsonl([json.loads(x) for x in PREFERENCE.splitlines()] * 4))
    job_id = stack.submit(file_id, max_steps=400, checkpoint_every=2)
    wait_for(lambda: checkpoint_steps(stack.sessions, job_id), 180, 0.2, "a first checkpoint")
    wait_for(lambda: _torn_checkpoints(stack.store, job_id), 120, 0.05, "a half-uploaded one")
    worker.kill()  # SIGKILL mid-upload: its trainer dies by PDEATHSIG
    torn = _torn_checkpoints(stack.store, job_id)
    r = stack.client.post(f"/v1/jobs/{job_id}/cancel", headers=stack.headers)
    assert r.status_code == 200 and r.json()["status"] == "cancelling", r.text

    def reaped() -> bool:
        with session_scope(stack.sessions) as s:
            job_states.reap_expired(s)
        return stack.job(job_id)["status"] == "cancelled"

    wait_for(reaped, 60, 0.5, "the lease to lapse and the job to be cancelled")
    figures = sweep_later(stack.sessions, stack.store)
    print(f"WORKER-KILL torn={sorted(torn)} " + json.dumps(figures))
    assert any(f"/{job_id}/{step}/" in k for step in torn for k in figures["orphans_before"])
    assert figures["orphaned_bytes_before_sweep"] > 0
    assert figures["orphaned_bytes_after_sweep"] == 0, figures["orphans_after"]
    assert not _torn_checkpoints(stack.store, job_id)
    with stack.sessions() as s:
        kept = list(s.scalars(select(Checkpoint.object_prefix).where(Checkpoint.job_id == job_id)))
    assert kept, "the recorded checkpoints were the job's to keep"
    for i, prefix in enumerate(kept):  # complete, every file as its manifest says
        stack.store.download_dir(prefix, tmp_path / f"check-{i}")
