"""Fault injection on the real stack (DESIGN.md §6): PostgreSQL, a private Redis broker,
SeaweedFS S3 and Celery worker processes, while jobs train.

Faults, one after the other on the same running jobs: S3 down for ~20 s; every PostgreSQL
connection of the test database terminated (pg_terminate_backend: the shared server is never
restarted); a worker SIGKILLed; the (private) Redis broker restarted. (Processes killed
mid-write, and the sweep after them: test_kills.py.)

After the faults every job must end `succeeded`, no attempt overlapped another (status
history), no event was lost (seqs gap-free), metrics are complete, and every checkpoint
prefix in the bucket is complete (`_COMPLETE`) and matches a checkpoint row.

Marked slow (`pytest -m slow`): a couple of minutes on 2 CPU cores.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.engine import make_url

from models.tables import Checkpoint, Job
from tests.faults.orphans import sweep_later
from tests.fixtures.live import free_port
from tests.fixtures.services import wait_for
from tests.worker.conftest import checkpoint_steps, events, metric_steps

pytestmark = [pytest.mark.slow, pytest.mark.faults]


class PrivateRedis:
    """redis-server on a port of its own (never the shared 6379): safe to kill."""

    def __init__(self, tmp: Path):
        self.port = free_port()
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
    figures = sweep_later(stack.sessions, stack.store)
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
