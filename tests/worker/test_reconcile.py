"""The multi-node control plane (worker.reconcile) on PostgreSQL and a local store, with an
in-memory launcher: no cluster, no trainer processes."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from contract.spec import JobSpec
from models import jobs as job_states
from models import launches, scheduling
from models.base import utcnow
from models.db import make_session_factory
from models.tables import Job, JobEvent
from models.teams import create_team
from storage import LocalStore, object_url
from storage.keys import run_spec_key
from tests.fixtures.db import _empty_pg
from tests.fixtures.rows import add_file
from tests.worker.conftest import PREFERENCE, TINY, checkpoint_steps, metric_steps
from tests.worker.reconcile_fakes import FakeLauncher, commit_checkpoint, commit_final, put_run_log
from worker.attempt import LeaseLost
from worker.config import WorkerSettings
from worker.launchers.base import LaunchState
from worker.reconcile import Reconciler
from worker.reconcile_tick import JobTick
from worker.runner import Runner

pytestmark = pytest.mark.usefixtures("_pg_engine")


class Env:
    def __init__(
        self, pg_url: str, engine: Any, tmp_path: Any, attempts: int = 3, store: Any = None
    ):
        _empty_pg(engine)
        self.tmp = tmp_path
        self.sessions = make_session_factory(engine)
        self.store = store or LocalStore(tmp_path / "objects")
        self.settings = WorkerSettings(
            DATABASE_URL=pg_url,
            BROKER_URL="memory://",
            STORAGE_URL=f"file://{tmp_path / 'objects'}",
            LEASE_SECONDS=30,
            MAX_JOB_ATTEMPTS=attempts,
            WORKER_DIR=str(tmp_path / "work"),
            LOG_LEVEL="WARNING",
        )
        self.launcher = FakeLauncher()
        self.now = utcnow()
        self.runner = Runner(self.settings, self.sessions, self.store, launcher=self.launcher)
        self.reconciler = Reconciler(
            self.settings, self.sessions, self.store, self.launcher, clock=lambda: self.now
        )
        with self.sessions() as s:
            self.team = create_team(s, "acme").id
            s.commit()

    def make_job(self, nodes: int = 2) -> str:
        with self.sessions() as s:
            f = add_file(s, self.store, self.team, PREFERENCE, fmt="preference")
            spec = JobSpec.model_validate({**TINY, "training_file": f.id}).model_dump(mode="json")
            spec["parallelism"] |= {"nodes": nodes, "processes_per_node": 1}  # as H-spec's API
            job = job_states.create_job(s, team_id=self.team, spec=spec, training_file_id=f.id)
            s.commit()
            return job.id

    def job(self, job_id: str) -> Job:
        with self.sessions() as s:
            return s.get(Job, job_id)

    def kinds(self, job_id: str) -> list[str]:
        with self.sessions() as s:
            q = select(JobEvent.kind).where(JobEvent.job_id == job_id).order_by(JobEvent.seq)
            return list(s.execute(q).scalars())

    def tick(self, seconds: float = 1.0) -> dict[str, str]:
        # never behind the wall clock: the runner's leases are real-time (a loaded machine
        # once spent > 1 s launching, and the first tick found the launch's lease still held)
        self.now = max(self.now, utcnow()) + timedelta(seconds=seconds)
        return self.reconciler.run_once()


@pytest.fixture
def env(pg_url, _pg_engine, tmp_path) -> Env:
    return Env(pg_url, _pg_engine, tmp_path)


def launched(env: Env) -> tuple[str, str]:
    job_id = env.make_job()
    assert env.runner.run(job_id) == "launched"
    return job_id, env.launcher.launch_name(job_id, 1)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_job_goes_from_launch_to_succeeded_with_its_run_log(
    backend, request, pg_url, _pg_engine, tmp_path
):
    store = request.getfixturevalue("s3_store") if backend == "s3" else None
    env = Env(pg_url, _pg_engine, tmp_path, store=store)
    job_id, name = launched(env)
    job = env.job(job_id)
    assert (job.status, job.launcher, job.attempt) == ("running", "trainjob", 1)
    launch = env.launcher.requests[name]
    assert (launch.nodes, launch.processes_per_node) == (2, 1)
    spec_url = object_url(env.store, run_spec_key(env.team, job_id, 1))
    assert spec_url.startswith("s3://" if backend == "s3" else "/")
    assert launch.args[:4] == ["-m", "trainer", "run", spec_url]
    assert launch.args[-1] == "--resume"  # always: a fresh start while no checkpoint exists
    assert launch.args[launch.args.index("--runlog") + 1].endswith(f"{job_id}/run/attempt-1/")
    assert launch.args[launch.args.index("--checkpoints") + 1].endswith(f"/{job_id}/")
    spec = json.loads(env.store.get_bytes(run_spec_key(env.team, job_id, 1)))
    file_url = object_url(env.store, f"{env.team}/files/{job.training_file_id}.jsonl")
    assert spec["training_file"] == file_url and spec["parallelism"]["nodes"] == 2

    # a second delivery of run_job, the reaper: neither touches a launched job
    assert env.runner.run(job_id) is None
    with env.sessions() as s:
        assert job_states.reap_expired(s, now=utcnow() + timedelta(hours=1)) == []
        who = scheduling.Claimant("other", 30)
        assert scheduling.claim_for(s, job_id, who, now=utcnow() + timedelta(hours=1)) is None
        s.commit()
    assert env.launcher.submits == [name]

    env.tick()
    env.tick()  # each state is said once
    env.launcher.set(name, LaunchState.STARTING, ranks_running=1, ranks_total=2)
    env.tick()
    env.launcher.set(name, LaunchState.RUNNING, ranks_running=2, ranks_total=2)
    put_run_log(env.store, env.team, job_id, 1, steps=3, checkpoints=[2])
    env.tick()
    assert metric_steps(env.sessions, job_id) == [1, 2, 3]
    assert checkpoint_steps(env.sessions, job_id) == []  # its event waits for the commit
    commit_checkpoint(env.store, env.team, job_id, 2, env.tmp)
    env.tick()
    env.tick()  # nothing read twice
    assert checkpoint_steps(env.sessions, job_id) == [2]
    assert metric_steps(env.sessions, job_id) == [1, 2, 3]
    kinds = env.kinds(job_id)
    assert kinds.count("waiting_for_admission") == kinds.count("starting") == 1
    assert kinds.count("running") == kinds.count("started") == kinds.count("checkpoint") == 1

    env.launcher.set(name, LaunchState.SUCCEEDED)
    commit_final(env.store, env.team, job_id, env.tmp)
    assert env.tick() == {job_id: "succeeded"}
    job = env.job(job_id)
    assert job.status == "succeeded" and job.current_step == 3
    final = job.result["final_model"]
    assert sorted(final["files"]) == ["config.json", "model.safetensors"] and final["bytes"] == 22
    assert job.result["last_checkpoint_step"] == 2
    assert name not in env.launcher.launches  # the terminal launch is removed
    assert env.tick() == {}


def test_a_failed_attempt_is_retried_from_its_checkpoint_until_the_budget_is_spent(
    pg_url, _pg_engine, tmp_path
):
    env = Env(pg_url, _pg_engine, tmp_path, attempts=2)
    job_id, name = launched(env)
    env.launcher.set(name, LaunchState.RUNNING, ranks_running=2, ranks_total=2)
    put_run_log(env.store, env.team, job_id, 1, steps=2, checkpoints=[2])
    commit_checkpoint(env.store, env.team, job_id, 2, env.tmp)
    env.tick()
    env.launcher.set(name, LaunchState.FAILED, reason="PodFailed", message="node 1 lost")
    assert env.tick() == {job_id: "launched"}
    job = env.job(job_id)
    assert (job.status, job.attempt) == ("running", 2)
    second = env.launcher.launch_name(job_id, 2)
    assert name in env.launcher.cancels and name not in env.launcher.launches
    assert "--resume" in env.launcher.requests[second].args  # from the committed step 2
    with env.sessions() as s:
        failed = s.execute(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "attempt_failed")
        ).scalar_one()
    assert failed.data["reason"] == "PodFailed" and "NCCL timeout" in failed.data["log_tail"]
    assert "/tmp/run" not in failed.data["log_tail"]  # scrubbed

    env.launcher.set(second, LaunchState.FAILED, reason="PodFailed", message="again")
    assert env.tick() == {job_id: "failed"}
    job = env.job(job_id)
    assert job.error["reason"] == "PodFailed" and "2 attempts exhausted" in job.error["message"]
    assert "NCCL timeout" in job.error["log_tail"]
    assert second not in env.launcher.launches
    assert checkpoint_steps(env.sessions, job_id) == [2]


def test_cancel_deletes_the_launch(env):
    job_id, name = launched(env)
    env.launcher.set(name, LaunchState.RUNNING)
    env.tick()
    with env.sessions() as s:
        assert job_states.request_cancel(s, job_id) == "cancelling"
        s.commit()
    assert env.tick() == {job_id: "cancelled"}
    assert name in env.launcher.cancels and not env.launcher.launches


def test_a_hang_and_a_vanished_launch_are_retried(env):
    job_id, name = launched(env)
    env.launcher.set(name, LaunchState.RUNNING)
    put_run_log(env.store, env.team, job_id, 1, steps=3)
    env.tick()
    env.tick(env.reconciler.hang_seconds - 10)  # slow, not hung
    assert env.job(job_id).attempt == 1
    assert env.tick(20) == {job_id: "launched"}  # no new step for HANG_SECONDS
    assert name in env.launcher.cancels
    second = env.launcher.launch_name(job_id, 2)
    env.launcher.launches.pop(second)  # gone from the cluster
    assert env.tick() == {job_id: "launched"}
    job = env.job(job_id)
    assert job.attempt == 3
    reasons = [e.data["reason"] for e in _events(env, job_id, "attempt_failed")]
    assert reasons == ["hang", "launch_missing"]


def test_a_lost_reconcile_is_taken_over_and_its_late_write_fenced_out(env):
    job_id, name = launched(env)
    with env.sessions() as s:  # reconcile A takes the job, then stalls past its lease
        row = s.get(Job, job_id)
        assert launches.take(
            s, job_id, "A", seen_owner=row.lease_owner, seen_attempt=1,
            lease_seconds=30, now=env.now + timedelta(seconds=1),
        )  # fmt: skip
        s.commit()
        a = JobTick(env.reconciler, s.get(Job, job_id), "A")
    assert env.tick(5) == {}  # A's lease holds
    env.launcher.set(name, LaunchState.FAILED, reason="PodFailed")
    assert env.tick(60) == {job_id: "launched"}  # B took over and moved to attempt 2
    before = env.kinds(job_id)
    with pytest.raises(LeaseLost):
        a.fenced(lambda s: job_states.add_event(s, job_id, "log", "late"))
    assert env.kinds(job_id) == before and env.job(job_id).attempt == 2


def test_a_failed_submit_backs_off_and_spends_no_attempt(env):
    """A 500 or 403 on create used to spend every attempt in a second (20 POSTs, job failed):
    the attempt stays unsubmitted, the next reconcile tries again after a backoff."""
    job_id = env.make_job()
    submit, refused = env.launcher.submit, []

    def refuse(request):
        refused.append(request.attempt)
        raise RuntimeError("Kubernetes refused to create TrainJob: HTTP 403 Forbidden")

    env.launcher.submit = refuse
    assert env.runner.run(job_id) == "submit_failed"
    job = env.job(job_id)
    assert (job.status, job.attempt, job.launch["submitted"]) == ("running", 1, False)
    assert env.tick(1) == {job_id: "backing_off"} and refused == [1]
    assert env.tick(20) == {job_id: "submit_failed"} and refused == [1, 1]
    assert env.tick(20) == {job_id: "backing_off"}  # the backoff doubled (30 s)
    env.launcher.submit = submit  # the operator fixed the RBAC
    assert env.tick(20) == {job_id: "launched"}
    job = env.job(job_id)
    assert (job.attempt, job.launch["submitted"]) == (1, True)
    assert "submit_at" not in job.launch
    assert env.kinds(job_id).count("submit_failed") == 2
    assert "attempt_failed" not in env.kinds(job_id)


def test_a_submit_failing_past_the_give_up_fails_the_job_with_its_cause(env):
    env.settings.SUBMIT_GIVE_UP_SECONDS = 100
    job_id = env.make_job()

    def refuse(request):
        raise RuntimeError("HTTP 500: admission webhook trainer.kubeflow.org denied it")

    env.launcher.submit = refuse
    assert env.runner.run(job_id) == "submit_failed"
    assert env.tick(60) == {job_id: "submit_failed"}  # 60 s of failing: tried again
    assert env.tick(60) == {job_id: "failed"}  # 120 s
    job = env.job(job_id)
    assert (job.error["reason"], job.attempt) == ("submit_failed", 1)
    assert "admission webhook" in job.error["message"]


def test_an_attempt_not_yet_submitted_is_submitted_by_the_reconcile(env):
    job_id, name = launched(env)
    with env.sessions() as s:  # as if its reconcile died between attempt + 1 and the submit
        job = s.get(Job, job_id)
        job.attempt, job.launch = 2, {"attempt": 2, "submitted": False}
        s.commit()
    assert env.tick() == {job_id: "launched"}
    second = env.launcher.launch_name(job_id, 2)
    assert env.launcher.submits == [name, second] and name in env.launcher.cancels
    assert env.job(job_id).launch["submitted"] is True
    assert env.tick() == {job_id: "pending"}


def test_beat_sends_the_reconcile_task():
    from worker import celery_app, tasks

    entry = celery_app.app.conf.beat_schedule["reconcile-jobs"]
    assert entry["task"] == tasks.reconcile_jobs.name == "worker.tasks.reconcile_jobs"
    assert entry["options"]["expires"] == entry["schedule"] > 0


def _events(env: Env, job_id: str, kind: str) -> list[JobEvent]:
    with env.sessions() as s:
        q = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == kind)
        return list(s.execute(q.order_by(JobEvent.seq)).scalars())


def test_a_worker_without_a_multi_node_launcher_fails_the_job_clearly(env, monkeypatch):
    job_id = env.make_job()
    env.runner.launcher = None  # the factory: worker.launchers.trainjob (absent or refusing)
    env.runner._reconciler = None

    def broken(settings):
        raise RuntimeError("no kube config")

    monkeypatch.setattr("worker.multinode.trainjob_launcher", broken)
    assert env.runner.run(job_id) == "failed"
    job = env.job(job_id)
    assert job.error["type"] == "no_launcher" and "no kube config" in job.error["message"]
