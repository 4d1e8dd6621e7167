"""The control plane end to end over HTTP: the reconcile (worker.reconcile) driving the real
TrainJob launcher (the `kubernetes` client) against the fake Kubernetes API server on
127.0.0.1 (tests/worker/fake_k8s.py). What the in-memory launcher of test_reconcile.py cannot
show: the TrainJobs really created, adopted, deleted on the server; nothing left behind."""

from __future__ import annotations

import pytest

from models import jobs as job_states
from tests.worker.reconcile_fakes import commit_checkpoint, commit_final, put_run_log
from tests.worker.test_reconcile import Env
from worker.launchers.trainjob import TrainJobLauncher
from worker.reconcile import Reconciler

pytestmark = pytest.mark.usefixtures("_pg_engine")


@pytest.fixture
def k8s_env(pg_url, _pg_engine, tmp_path, fake_k8s):
    def make(attempts: int = 3) -> Env:
        env = Env(pg_url, _pg_engine, tmp_path, attempts=attempts)
        launcher = TrainJobLauncher(
            "default", "humanline-torch", api_client=fake_k8s.api_client, timeout_s=10,
            backoff_s=0.01,
        )  # fmt: skip
        env.launcher = launcher
        env.runner.launcher = launcher
        env.reconciler = Reconciler(
            env.settings, env.sessions, env.store, launcher, clock=lambda: env.now
        )
        return env

    return make


def names(fake_k8s) -> list[str]:
    return sorted(name for _, name in fake_k8s.trainjobs)


def test_a_lost_node_is_retried_then_the_job_succeeds_and_nothing_is_left(k8s_env, fake_k8s):
    env = k8s_env()
    job_id = env.make_job()
    assert env.runner.run(job_id) == "launched"
    first = env.launcher.launch_name(job_id, 1)
    assert names(fake_k8s) == [first]
    manifest = fake_k8s.trainjob(first)
    assert manifest["spec"]["trainer"]["numNodes"] == 2
    assert manifest["spec"]["trainer"]["command"] == ["torchrun"]
    assert manifest["spec"]["trainer"]["args"][:3] == ["-m", "trainer", "run"]

    fake_k8s.set_condition(first, "Suspended", "True", reason="Kueue")
    env.tick()
    fake_k8s.set_condition(first, "Suspended", "False")
    fake_k8s.set_pods(first, ["Running", "Pending"])
    env.tick()
    fake_k8s.set_pods(first, ["Running", "Running"])
    put_run_log(env.store, env.team, job_id, 1, steps=2, checkpoints=[2])
    commit_checkpoint(env.store, env.team, job_id, 2, env.tmp)
    env.tick()
    kinds = env.kinds(job_id)
    for kind in ("waiting_for_admission", "starting", "running"):
        assert kinds.count(kind) == 1, (kind, kinds)

    # node 1 lost: the TrainJob fails; the retry resumes from step 2 on a new TrainJob
    fake_k8s.set_pods(first, ["Failed", "Failed"], log="NCCL watchdog timeout on rank 1")
    fake_k8s.fail_jobs(first, "node 1 lost")  # Trainer's reason: FailedJobs
    assert env.tick() == {job_id: "launched"}
    second = env.launcher.launch_name(job_id, 2)
    assert names(fake_k8s) == [second]  # the failed one deleted, not orphaned
    assert "--resume" in fake_k8s.trainjob(second)["spec"]["trainer"]["args"]
    deletes = [path for method, path, _ in fake_k8s.requests if method == "DELETE"]
    assert any(first in path for path in deletes)

    fake_k8s.set_pods(second, ["Running", "Running"])
    put_run_log(env.store, env.team, job_id, 2, steps=4, checkpoints=[2, 4])
    commit_checkpoint(env.store, env.team, job_id, 4, env.tmp)
    commit_final(env.store, env.team, job_id, env.tmp)
    fake_k8s.complete(second)  # AllJobsCompleted
    env.tick()
    assert env.tick(5) in ({}, {job_id: "succeeded"})
    assert env.job(job_id).status == "succeeded"
    assert names(fake_k8s) == []  # the terminal TrainJob deleted by us


def test_the_budget_spent_fails_the_job_with_nothing_left_on_the_cluster(k8s_env, fake_k8s):
    env = k8s_env(attempts=2)
    job_id = env.make_job()
    env.runner.run(job_id)
    for attempt in (1, 2):
        name = env.launcher.launch_name(job_id, attempt)
        fake_k8s.set_pods(name, ["Failed", "Running"], log="rendezvous timed out")
        fake_k8s.fail_jobs(name)
        env.tick()
    job = env.job(job_id)
    assert job.status == "failed" and "2 attempts exhausted" in job.error["message"]
    assert "rendezvous timed out" in job.error["log_tail"]
    assert names(fake_k8s) == []


def test_a_second_worker_takes_over_and_adopts_the_trainjob(k8s_env, fake_k8s):
    """Worker A submitted and died before its next reconcile; B's reconcile takes the lease over
    once it expires and follows (adopts) the same TrainJob: no second one is created."""
    env = k8s_env()
    job_id = env.make_job()
    env.runner.run(job_id)
    name = env.launcher.launch_name(job_id, 1)
    creates = sum(m == "POST" for m, _, _ in fake_k8s.requests)
    env.tick(120)  # long past any lease A held
    fake_k8s.set_pods(name, ["Running", "Running"])
    env.tick()
    assert names(fake_k8s) == [name]
    assert sum(m == "POST" for m, _, _ in fake_k8s.requests) == creates
    assert "running" in env.kinds(job_id)
    # cancel = delete
    with env.sessions() as s:
        assert job_states.request_cancel(s, job_id) == "cancelling"
        s.commit()
    assert env.tick() == {job_id: "cancelled"}
    assert names(fake_k8s) == []


def test_an_api_outage_is_retried_and_a_vanished_trainjob_retries_the_attempt(k8s_env, fake_k8s):
    env = k8s_env()
    job_id = env.make_job()
    env.runner.run(job_id)
    name = env.launcher.launch_name(job_id, 1)
    fake_k8s.fail(503, method="GET", times=2)  # the launcher's own retries absorb it
    fake_k8s.set_pods(name, ["Running", "Running"])
    env.tick()
    assert "running" in env.kinds(job_id)
    del fake_k8s.trainjobs[("default", name)]  # deleted behind our back
    assert env.tick() == {job_id: "launched"}
    assert names(fake_k8s) == [env.launcher.launch_name(job_id, 2)]
    assert env.job(job_id).attempt == 2
