"""What breaks a multi-node job first on a real cluster (issue 36), reproduced on the fake
Kubernetes API server (tests/worker/fake_k8s.py) through the real client and the reconcile:
a 500 on create, a TrainJob whose JobSet is never created, a 40-minute Kueue re-suspension,
a worker that dies between the create and its record, orphans, an admission that never comes,
a drained node. Only a real failure spends an attempt, and every error names its cause."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from models import jobs as job_states
from models.tables import Job, JobEvent
from storage.keys import run_spec_key
from tests.worker.reconcile_fakes import commit_checkpoint, put_run_log
from tests.worker.test_reconcile import Env, _events
from worker.launchers.trainjob import TrainJobLauncher
from worker.reconcile import Reconciler

pytestmark = pytest.mark.usefixtures("_pg_engine")


@pytest.fixture
def k8s(pg_url, _pg_engine, tmp_path, fake_k8s):
    def make(attempts: int = 3, queue: str | None = None) -> Env:
        env = Env(pg_url, _pg_engine, tmp_path, attempts=attempts)
        launcher = TrainJobLauncher(
            "default", "humanline-torch", queue=queue, api_client=fake_k8s.api_client,
            timeout_s=10, backoff_s=0.01,
        )  # fmt: skip
        env.launcher = env.runner.launcher = launcher
        env.reconciler = Reconciler(
            env.settings, env.sessions, env.store, launcher, clock=lambda: env.now
        )
        return env

    return make


def names(fake_k8s) -> list[str]:
    return sorted(name for _, name in fake_k8s.trainjobs)


def posts(fake_k8s) -> int:
    return sum(m == "POST" for m, _, _ in fake_k8s.requests)


def failures(env: Env, job_id: str) -> list[dict]:
    return [e.data for e in _events(env, job_id, "attempt_failed")]


def test_a_500_on_create_backs_off_and_spends_no_attempt(k8s, fake_k8s):
    """It used to make 20 POSTs in under a second and fail the job."""
    env = k8s()
    job_id = env.make_job()
    fake_k8s.fail(500, method="POST", times=4)  # the launcher's 4 tries, all refused
    assert env.runner.run(job_id) == "submit_failed"
    assert posts(fake_k8s) == 4 and names(fake_k8s) == []
    job = env.job(job_id)
    assert (job.status, job.attempt) == ("running", 1)
    assert env.tick(1) == {job_id: "backing_off"} and posts(fake_k8s) == 4
    assert env.tick(20) == {job_id: "launched"}
    assert names(fake_k8s) == [env.launcher.launch_name(job_id, 1)]
    assert env.job(job_id).attempt == 1 and failures(env, job_id) == []


def test_a_trainjob_whose_jobset_never_comes_fails_its_attempt_within_minutes(k8s, fake_k8s):
    env = k8s(attempts=2)
    job_id = env.make_job()
    env.runner.run(job_id)
    first = env.launcher.launch_name(job_id, 1)
    assert env.tick() == {job_id: "starting"}  # admitted (no Kueue): no pods, no condition
    assert env.tick(300) == {job_id: "starting"}
    assert env.tick(301) == {job_id: "launched"}  # 601 s > START_DEADLINE_SECONDS
    (failed,) = failures(env, job_id)
    assert failed["reason"] == "not_started" and "no pod created" in failed["message"]
    # Trainer's Event names the real cause: the attempt ends on the next reconcile
    second = env.launcher.launch_name(job_id, 2)
    assert names(fake_k8s) == [second] and first != second
    fake_k8s.creation_fails(second, 'pods "x" is forbidden: violates PodSecurity "restricted"')
    assert env.tick() == {job_id: "failed"}
    job = env.job(job_id)
    assert job.error["reason"] == "TrainJobResourcesCreationFailed"
    assert "PodSecurity" in job.error["message"] and names(fake_k8s) == []


def test_a_40_minute_re_suspension_is_no_hang_and_the_pods_resume(k8s, fake_k8s):
    env = k8s(queue="gpu")
    job_id = env.make_job()
    env.runner.run(job_id)
    name = env.launcher.launch_name(job_id, 1)
    args = fake_k8s.trainjob(name)["spec"]["trainer"]["args"]
    assert args[-1] == "--resume"  # the re-admitted pods rerun these: never from step 0
    assert args[args.index("--out") + 1].startswith("/scratch/")
    spec = json.loads(env.store.get_bytes(run_spec_key(env.team, job_id, 1)))
    assert spec["checkpoint_every"] > 0  # a multi-node spec without one gets a default
    fake_k8s.admit(name)
    fake_k8s.set_pods(name, ["Running", "Running"])
    put_run_log(env.store, env.team, job_id, 1, steps=2, checkpoints=[2])
    commit_checkpoint(env.store, env.team, job_id, 2, env.tmp)
    assert env.tick() == {job_id: "running"}
    fake_k8s.preempt(name)  # Kueue evicts it for a higher-priority job
    assert env.tick() == {job_id: "pending"}
    for _ in range(4):
        assert env.tick(600) == {job_id: "pending"}  # 40 minutes suspended
    fake_k8s.admit(name)
    fake_k8s.set_pods(name, ["Running", "Running"])
    assert env.tick() == {job_id: "running"}
    assert env.tick(60) == {job_id: "running"}
    assert failures(env, job_id) == [] and env.job(job_id).attempt == 1
    kinds = env.kinds(job_id)
    assert kinds.count("suspended") == 1 and kinds.count("running") == 2


def test_cancel_after_a_worker_died_between_create_and_record_leaves_nothing(k8s, fake_k8s):
    env = k8s()
    job_id = env.make_job()
    env.runner.run(job_id)
    name = env.launcher.launch_name(job_id, 1)
    with env.sessions() as s:  # the create happened, its fenced record did not
        s.get(Job, job_id).launch = {"attempt": 1, "submitted": False}
        assert job_states.request_cancel(s, job_id) == "cancelling"
        s.commit()
    assert names(fake_k8s) == [name]
    assert env.tick(120) == {job_id: "cancelled"}
    assert names(fake_k8s) == []


def test_the_sweep_deletes_trainjobs_of_ended_jobs_and_old_attempts(k8s, fake_k8s):
    env = k8s()
    job_id, ended = env.make_job(), env.make_job()
    env.runner.run(job_id)
    env.runner.run(ended)
    current = env.launcher.launch_name(job_id, 1)
    with env.sessions() as s:
        s.get(Job, ended).status = "failed"  # ended while its TrainJob was being created
        s.commit()
    meta = fake_k8s.trainjob(current)["metadata"]
    labels = {**meta["labels"], "humanline.dev/attempt": "0"}  # an attempt before the current
    old = {**fake_k8s.trainjob(current), "metadata": {**meta, "name": "hl-old", "labels": labels}}
    fake_k8s.trainjobs[("default", "hl-old")] = old
    fake_k8s.trainjobs[("default", "not-ours")] = {"metadata": {"name": "not-ours"}}
    stranger = {"humanline.dev/job-id": "job-of-another-deployment", "humanline.dev/attempt": "1"}
    fake_k8s.trainjobs[("default", "theirs")] = {"metadata": {"name": "theirs", "labels": stranger}}
    env.tick()
    assert names(fake_k8s) == sorted([current, "not-ours", "theirs"])
    fake_k8s.trainjobs[("default", "hl-old")] = old
    env.tick(60)
    assert "hl-old" in names(fake_k8s)  # the next sweep waits its period
    env.tick(300)
    assert names(fake_k8s) == sorted([current, "not-ours", "theirs"])


def test_an_admission_that_never_comes_fails_with_kueues_reason(k8s, fake_k8s):
    env = k8s(queue="gpu")
    env.settings.ADMISSION_TIMEOUT_SECONDS = 3600
    job_id = env.make_job()
    env.runner.run(job_id)
    name = env.launcher.launch_name(job_id, 1)
    quota = "couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu"
    fake_k8s.workload(name, [{"type": "QuotaReserved", "status": "False", "message": quota}])
    assert env.tick() == {job_id: "pending"}
    assert env.tick(3000) == {job_id: "pending"}
    assert env.tick(700) == {job_id: "failed"}
    job = env.job(job_id)
    assert job.error["reason"] == "admission_timeout" and quota in job.error["message"]
    assert names(fake_k8s) == []


def test_a_drained_node_spends_no_attempt(k8s, fake_k8s):
    env = k8s(attempts=1)
    job_id = env.make_job()
    env.runner.run(job_id)
    name = env.launcher.launch_name(job_id, 1)
    drained = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    fake_k8s.set_pods(name, ["Failed", "Failed"], conditions=[drained])
    fake_k8s.fail_jobs(name, "jobset failed")
    assert env.tick() == {job_id: "launched"}  # the only attempt was not spent
    (failed,) = failures(env, job_id)
    assert failed["reason"] == "Disrupted"
    second = env.launcher.launch_name(job_id, 2)
    fake_k8s.set_pods(second, ["Failed", "Running"])
    fake_k8s.fail_jobs(second, "node 0 exited 1")
    assert env.tick() == {job_id: "failed"}  # a real failure spends it
    assert "1 attempts exhausted" in env.job(job_id).error["message"]


def test_a_cpu_job_asks_for_no_gpu_and_the_memory_of_its_estimate(k8s, fake_k8s):
    env = k8s()
    job_id = env.make_job()
    with env.sessions() as s:  # what POST /v1/jobs records: the estimate in `created`
        event = s.execute(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "created")
        ).scalar_one()
        event.data = {**event.data, "estimate": {"memory_gib_per_process": 6.0}}
        s.commit()
    env.runner.run(job_id)
    trainer = fake_k8s.trainjob(env.launcher.launch_name(job_id, 1))["spec"]["trainer"]
    assert trainer["resourcesPerNode"] == {  # 1 process per node, 6 GiB x 1.25
        "requests": {"cpu": "1", "memory": "8Gi", "nvidia.com/gpu": "0"},
        "limits": {"nvidia.com/gpu": "0"},
    }
