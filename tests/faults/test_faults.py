# ruff: noqa: F811 - pytest fixtures imported into the module and used as arguments
"""Fault injection on the real stack (DESIGN.md §6): PostgreSQL, a private Redis broker,
SeaweedFS S3 and Celery worker processes, while jobs train.

Faults, one after the other on the same running jobs: S3 down for ~20 s; every PostgreSQL
connection of the test database terminated (pg_terminate_backend: the shared server is never
restarted); a worker SIGKILLed; the (private) Redis broker restarted; and, separately, a
uvicorn API process SIGKILLed under a burst of creates while an upload streams in; and a
worker SIGKILLed mid-checkpoint-upload, its job then cancelled. After each kill, one sweep
(worker.sweeper) leaves zero orphaned bytes.

After the faults every job must end `succeeded`, no attempt overlapped another (status
history), no event was lost (seqs gap-free), metrics are complete, and every checkpoint
prefix in the bucket is complete (`_COMPLETE`) and matches a checkpoint row.

Marked slow (`pytest -m slow`): a couple of minutes on 2 CPU cores.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select, text
from sqlalchemy.engine import make_url

from models import jobs as job_states
from models.db import session_scope
from models.tables import Checkpoint, File, Job
from storage import LocalStore
from tests.faults.orphans import orphans, physical
from tests.fixtures.services import REPO, celery_workers, wait_for  # noqa: F401 - fixture
from tests.worker.conftest import (  # noqa: F401 - fixtures
    PREFERENCE,
    TINY,
    checkpoint_steps,
    events,
    jsonl,
    metric_steps,
    stack,
)

pytestmark = [pytest.mark.slow, pytest.mark.faults]
MiB = 1 << 20


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class PrivateRedis:
    """redis-server on a port of its own (never the shared 6379): safe to kill."""

    def __init__(self, tmp: Path):
        self.port = _free_port()
        self.tmp = tmp
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", str(self.tmp)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        import redis

        def up() -> bool:
            try:
                return redis.Redis(port=self.port).ping()
            except redis.exceptions.ConnectionError:
                return False

        wait_for(up, 10, what="private redis")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


_BROKERS: dict[str, PrivateRedis] = {}


@pytest.fixture
def redis_broker_url(tmp_path):
    """Overrides the shared-Redis broker of the stack with a private, killable one."""
    broker = PrivateRedis(tmp_path)
    broker.start()
    _BROKERS[broker.url] = broker
    try:
        yield broker.url
    finally:
        _BROKERS.pop(broker.url, None)
        broker.stop()  # the process of the last start()


def _private_redis_restart(url: str) -> None:
    """SIGKILL the private broker and start it again on the same port (empty: no save)."""
    broker = _BROKERS[url]
    broker.stop()
    time.sleep(2)
    broker.start()


def terminate_db_connections(db_url: str) -> int:
    """Kill every backend on the test database but ours (an outage of that database)."""
    from tests.fixtures.db import _admin_engine

    name = make_url(db_url).database
    admin = _admin_engine()
    try:
        with admin.connect() as conn:
            killed = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = :db AND pid <> pg_backend_pid()"
                ),
                {"db": name},
            ).scalar_one()
    finally:
        admin.dispose()
    return int(killed)


def lost_jobs(sessions, job_ids: list[str]) -> list[str]:
    """Submitted jobs that did not end `succeeded` (failed, cancelled, stuck) or whose row is
    gone: what the fault summary's `jobs_lost` counts."""
    with sessions() as s:
        done = dict(s.execute(select(Job.id, Job.status).where(Job.id.in_(job_ids))).all())
    return [j for j in job_ids if done.get(j) != "succeeded"]


def test_lost_jobs_counts_every_job_that_did_not_succeed(db_sessions):
    """The summary's `jobs_lost` was a constant 0; it is now this function, which sees a
    failed job, a still-running one and a vanished row."""
    from models import jobs as job_states
    from models.teams import create_team

    with db_sessions() as s:
        team = create_team(s, "lost").id
        ids = [job_states.create_job(s, team_id=team, spec={}).id for _ in range(3)]
        s.commit()
    assert lost_jobs(db_sessions, ids) == ids  # queued: not succeeded
    with db_sessions() as s:
        for j in ids[:2]:
            assert job_states.claim(s, j, "w", 60) is not None
        assert job_states.finish(s, ids[0], "w", "succeeded")
        assert job_states.finish(s, ids[1], "w", "failed")
        s.commit()
    assert lost_jobs(db_sessions, [*ids, "job-vanished"]) == [ids[1], ids[2], "job-vanished"]


def check_invariants(stack, s3_server, job_ids: list[str], steps: int, every: int) -> dict:
    """The promises after faults; returns per-job attempt counts. The storage check covers
    every object of the bucket, whichever job (in whichever state) or file it belongs to."""
    attempts = {}
    for job_id in job_ids:
        job = stack.job(job_id)
        assert job["status"] == "succeeded", (job_id, job["status"], job["error"])
        history = events(stack.sessions, job_id)
        seqs = [e.seq for e in history]
        assert seqs == list(range(1, len(seqs) + 1)), f"event lost in {job_id}: {seqs}"
        # attempts never overlap: status transitions alternate queued -> running -> ...
        statuses = [e.data["to"] for e in history if e.kind == "status"]
        assert statuses[0] == "queued" and statuses[-1] == "succeeded", statuses
        for a, b in itertools.pairwise(statuses):
            assert (a, b) in {
                ("queued", "running"), ("running", "queued"), ("running", "succeeded"),
            }, statuses  # fmt: skip
        assert statuses.count("running") == job["attempt"], (statuses, job["attempt"])
        assert [e.kind for e in history].count("finished") == 1
        assert metric_steps(stack.sessions, job_id) == list(range(1, steps + 1))
        assert checkpoint_steps(stack.sessions, job_id) == list(range(every, steps + 1, every))
        attempts[job_id] = job["attempt"]
    # the bucket: every step-N prefix is complete and recorded; every row has its objects
    keys = s3_server.list_all(stack.bucket)
    prefixes: dict[str, set[str]] = {}
    for key in keys:
        m = re.match(r"(.*/step-\d+/)(.*)$", key)
        if m:
            prefixes.setdefault(m.group(1), set()).add(m.group(2))
    with stack.sessions() as s:
        rows = {c.object_prefix: c for c in s.execute(select(Checkpoint)).scalars()}
    for prefix, names in prefixes.items():
        assert "_COMPLETE" in names, f"incomplete checkpoint {prefix}: {sorted(names)}"
        assert prefix in rows, f"orphaned checkpoint objects {prefix}"
        for f in rows[prefix].files or []:
            assert f in names, (prefix, f)
    for prefix in rows:
        assert prefix in prefixes, f"checkpoint row without objects: {prefix}"
    for job_id in job_ids:
        final = stack.job(job_id)["result"]["final_model"]["prefix"]
        assert final + "_COMPLETE" in keys
    # whatever state any job of the bucket is in: no byte that no row references survives a
    # sweep (temporary objects and unfinished multipart uploads included)
    figures = _sweep_later(stack.sessions, stack.store)
    print("FAULTS-SWEEP " + json.dumps(figures))
    assert figures["orphaned_bytes_after_sweep"] == 0, figures["orphans_after"]
    return attempts


def test_jobs_survive_s3_db_worker_and_broker_faults(
    stack,
    celery_workers,
    s3_server,
    db_url,
    tmp_path,
):
    steps, every = 400, 50  # both jobs still train when the faults strike, even on a quiet machine
    logs = celery_workers.logs
    workers = [celery_workers.start(stack.env, name=f"f{i}") for i in range(2)]
    file_id = stack.upload()
    jobs = [stack.submit(file_id, max_steps=steps, checkpoint_every=every, seed=s) for s in (1, 2)]
    faults: list[dict] = []
    hit: set[str] = set()  # jobs not yet finished when a fault struck

    def fault(name: str, **info) -> None:
        live = [j for j in jobs if stack.job(j)["status"] not in ("succeeded", "failed")]
        hit.update(live)
        faults.append({"fault": name, "live_jobs": len(live), **info})

    wait_for(
        lambda: all(checkpoint_steps(stack.sessions, j) for j in jobs), 120, what="checkpoints"
    )

    # 1. a worker SIGKILLed mid-job (its trainer dies by PDEATHSIG); a fresh one replaces it
    running = [j for j in jobs if stack.job(j)["status"] == "running"]
    assert running, "no job running at the worker kill"
    workers[0].kill()
    fault("worker SIGKILL", running=len(running))
    workers.append(celery_workers.start(stack.env, name="f2"))

    # 2. every DB connection of the test database terminated, twice, a few seconds apart
    killed = terminate_db_connections(db_url)
    time.sleep(3)
    killed += terminate_db_connections(db_url)
    fault("postgres backends terminated", backends=killed)

    # 3. S3 down for 20 s while the jobs train and checkpoint
    s3_server.stop()
    fault("s3 stopped", seconds=20)
    time.sleep(20)
    s3_server.start()

    # 4. the broker restarted (private redis-server: killed, started again on its port),
    # then a new job goes through it
    _private_redis_restart(stack.broker_url)
    fault("redis restart")
    jobs.append(stack.submit(file_id, max_steps=steps, checkpoint_every=every, seed=3))

    for job_id in jobs:
        stack.wait_done(job_id, 240, logs)
    lost = lost_jobs(stack.sessions, jobs)  # measured, then asserted: never a constant
    with stack.sessions() as s:
        attempts = dict(s.execute(select(Job.id, Job.attempt).where(Job.id.in_(jobs))).all())
    retried = sum(1 for a in attempts.values() if a > 1)
    print(
        "FAULTS "
        + json.dumps(
            {
                "faults": faults,
                "jobs": len(jobs),
                "jobs_affected": len(hit),
                "jobs_retried": retried,
                "attempts": attempts,
                "jobs_lost": len(lost),
            }
        )
    )
    assert lost == [], f"jobs lost to the faults: {lost}"
    assert check_invariants(stack, s3_server, jobs, steps, every) == attempts
    assert retried >= 1, "the worker kill should have cost its job an attempt"


# --- the API process SIGKILLed ---------------------------------------------------------------


def _sweep_later(sessions, store) -> dict:
    """Orphaned bytes (tests.faults.orphans: the backend itself against the rows) before and
    after one sweep run as if an hour had passed (the grace period protects young objects;
    nothing here writes any more)."""
    from worker.sweeper import sweep

    before = orphans(store, sessions)
    report = sweep(sessions, store, grace_seconds=3600, now=time.time() + 3601)
    after = orphans(store, sessions)
    return {
        "orphaned_bytes_before_sweep": sum(before.values()),
        "orphaned_bytes_after_sweep": sum(after.values()),
        "orphans_before": sorted(before),
        "orphans_after": sorted(after),
        "sweep": report.as_dict(),
    }


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


def _temp_bytes(store) -> int:
    """Bytes of temporary files (local) or unfinished multipart uploads (S3)."""
    return sum(
        size for key, size in physical(store).items()
        if key.startswith(".tmp/") or key.endswith("#upload")
    )  # fmt: skip


@pytest.mark.parametrize("backend", ["s3", "local"])
def test_api_process_killed_mid_burst_loses_nothing(stack, s3_server, db_url, tmp_path, backend):
    """uvicorn (a real process) SIGKILLed while 40 creates with Idempotency-Keys and an upload
    that is still streaming (12 MiB already stored) are in flight; restarted, every key is
    retried: each yields exactly one job, and every file row has its object. The cut upload
    left orphaned bytes (a temporary file, or an S3 multipart upload), and a handful of small
    uploads may have been killed between their put and their commit: one sweep removes every
    orphaned byte and no file a row names."""
    port = _free_port()
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
    wait_for(lambda: _temp_bytes(store) >= 8 * MiB, 120, 0.1, "the slow upload to be stored")
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
        figures = _sweep_later(stack.sessions, store)
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
    figures = _sweep_later(stack.sessions, stack.store)
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
