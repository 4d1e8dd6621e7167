"""Real Celery worker processes on the production stack: PostgreSQL, Redis (broker), SeaweedFS
(S3), jobs submitted through the API. LEASE_SECONDS=5, heartbeat 1 s, reaper every 1 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load, load_file

from models.tables import Job
from tests.api.conftest import presigned_checkpoint_file
from tests.worker.conftest import (
    PREFERENCE,
    REPO,
    checkpoint_steps,
    events,
    metric_steps,
    trainer_pids,
    wait_for,
)
from trainer.checkpoint import read_weights

pytestmark = pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)


def test_job_trains_end_to_end(stack, celery_workers, s3_server):
    worker = celery_workers.start(stack.env)
    file_id = stack.upload()
    job_id = stack.submit(file_id, max_steps=6, checkpoint_every=2, quality_sample=8)
    # The API sent run_job to the ingress queue (`celery`); a duplicate delivery goes
    # straight to the job's own queue. Whichever runs first trains; the other is a no-op.
    stack.send(job_id, queue="cpu")

    job = stack.wait_done(job_id, 120, celery_workers.logs)
    assert job["status"] == "succeeded", job["error"]
    assert job["attempt"] == 1
    assert (job["current_step"], job["total_steps"]) == (6, 6)
    # Three deliveries, no more: the API's (forwarded once), the forwarded copy and ours;
    # Celery logs "received" and "succeeded" for each.
    wait_for(lambda: worker.log().count("Task worker.tasks.run_job[") >= 6, 30, what="3 deliveries")
    time.sleep(0.5)
    log = worker.log()
    assert log.count("Task worker.tasks.run_job[") == 6, log
    assert log.count("forwarded from queue celery to cpu") == 1
    assert log.count("not claimable") == 1
    assert "claimed (attempt 1)" in log

    history = events(stack.sessions, job_id)
    kinds = [e.kind for e in history]
    assert kinds.count("started") == 1 and kinds.count("finished") == 1
    assert [e.data["step"] for e in history if e.kind == "checkpoint"] == [2, 4, 6]
    assert "data" in kinds and "data_quality" in kinds
    assert kinds.index("finished") > max(i for i, k in enumerate(kinds) if k == "checkpoint")
    statuses = [e.data["to"] for e in history if e.kind == "status"]
    assert statuses == ["queued", "running", "succeeded"]
    assert [e.seq for e in history] == list(range(1, len(history) + 1))

    metrics = stack.get(f"/v1/jobs/{job_id}/metrics")["data"]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    assert all("loss" in m["values"] for m in metrics)

    checkpoints = stack.get(f"/v1/jobs/{job_id}/checkpoints")["data"]
    assert [c["step"] for c in checkpoints] == [2, 4, 6]
    keys = set(s3_server.list_all(stack.bucket))
    team_job = f"{job_id}/"
    for c in checkpoints:
        assert ".metadata" in c["files"] and c["bytes"] > 0  # DCP shards (trainer.checkpoint)
        assert "_COMPLETE" not in c["files"]
        prefix = next(k for k in keys if k.endswith(f"{team_job}step-{c['step']}/_COMPLETE"))
        assert prefix
    final = job["result"]["final_model"]
    assert final["prefix"] + "_COMPLETE" in keys
    assert final["prefix"] + "model.safetensors" in keys
    assert job["result"]["last_checkpoint_step"] == 6

    fetched = presigned_checkpoint_file(stack.client, stack.headers, job_id, 6, "state.json")
    assert fetched.status_code == 200
    assert json.loads(fetched.content)["format"] == 2

    assert trainer_pids(job_id) == []
    assert not list(stack.work_dir.glob(f"{job_id}/*")), "run directory left behind"


def test_cancel_during_training_stops_with_a_checkpoint(stack, celery_workers, s3_server):
    celery_workers.start(stack.env)
    job_id = stack.submit(stack.upload(), max_steps=200, checkpoint_every=0)
    wait_for(lambda: len(metric_steps(stack.sessions, job_id)) >= 2, 60, what="training")

    t0 = time.monotonic()
    r = stack.client.post(f"/v1/jobs/{job_id}/cancel", headers=stack.headers)
    assert r.status_code == 200 and r.json()["status"] == "cancelling"
    job = stack.wait_done(job_id, 30, celery_workers.logs)
    took = time.monotonic() - t0

    assert job["status"] == "cancelled", job["error"]
    assert took < 10, f"cancelling took {took:.1f}s"
    step = job["result"]["last_checkpoint_step"]
    assert 2 <= step < 200
    assert checkpoint_steps(stack.sessions, job_id) == [step]
    keys = s3_server.list_all(stack.bucket)
    assert any(k.endswith(f"{job_id}/step-{step}/_COMPLETE") for k in keys)
    assert not any("/final/" in k for k in keys)
    kinds = [e.kind for e in events(stack.sessions, job_id)]
    assert "stopped" in kinds and "finished" not in kinds
    assert trainer_pids(job_id) == []
    print(f"cancelled at step {step}, {took:.1f}s after the request")


def test_killed_worker_job_resumes_on_a_new_worker_bit_exactly(
    stack, celery_workers, s3_server, tmp_path
):
    steps, every = 200, 20  # long enough that the kill always lands mid-run on a quiet machine
    worker_a = celery_workers.start(stack.env, name="a")
    job_id = stack.submit(stack.upload(), max_steps=steps, checkpoint_every=every)

    # The same spec, uninterrupted, straight through the trainer CLI (meanwhile).
    data = tmp_path / "train.jsonl"
    data.write_bytes(PREFERENCE)
    spec = {**stack.job(job_id)["spec"], "training_file": str(data)}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    ref_dir = tmp_path / "reference"
    reference = subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", str(tmp_path / "spec.json"),
         "--out", str(ref_dir), "--no-progress"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip

    wait_for(lambda: checkpoint_steps(stack.sessions, job_id), 90, what="a first checkpoint")
    trainers = trainer_pids(job_id)
    assert trainers, "no trainer process found"
    worker_a.kill()
    at_kill = checkpoint_steps(stack.sessions, job_id)[-1]
    assert at_kill < steps, "the job finished before the kill"
    wait_for(lambda: not any(p in trainer_pids(job_id) for p in trainers), 10,
             what="the orphaned trainer to die (PR_SET_PDEATHSIG)")  # fmt: skip

    worker_b = celery_workers.start(stack.env, name="b")
    job = stack.wait_done(job_id, 150, celery_workers.logs)
    assert job["status"] == "succeeded", job["error"]
    assert job["attempt"] == 2
    assert "claimed (attempt 2)" in worker_b.log()

    history = events(stack.sessions, job_id)
    requeue = [e for e in history if e.kind == "status" and "expired" in e.message]
    assert len(requeue) == 1 and requeue[0].data["to"] == "queued"
    resumed = [e for e in history if e.kind == "resumed"]
    assert len(resumed) == 1 and resumed[0].data["step"] >= at_kill
    assert metric_steps(stack.sessions, job_id) == list(range(1, steps + 1))
    assert checkpoint_steps(stack.sessions, job_id) == list(range(every, steps + 1, every))

    assert reference.wait(timeout=120) == 0, reference.stderr.read().decode()[-3000:]
    expected = read_weights(ref_dir / "checkpoints" / f"step-{steps}")
    prefix = next(
        k
        for k in s3_server.list_all(stack.bucket)
        if k.endswith(f"{job_id}/step-{steps}/_COMPLETE")
    ).removesuffix("_COMPLETE")
    stack.store.download_dir(prefix, tmp_path / "stored")
    got = read_weights(tmp_path / "stored")
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    final = job["result"]["final_model"]["prefix"] + "model.safetensors"
    got_final = load(stack.store.get_bytes(final))
    ref_final = load_file(ref_dir / "final" / "model.safetensors")
    assert all(torch.equal(got_final[k], ref_final[k]) for k in ref_final)
    print(f"killed after checkpoint {at_kill}; resumed from {resumed[0].data['step']}")


def test_warm_shutdown_releases_the_job_to_another_worker(stack, celery_workers):
    first = celery_workers.start(stack.env, name="first")
    job_id = stack.submit(stack.upload(), max_steps=200, checkpoint_every=0)
    wait_for(lambda: len(metric_steps(stack.sessions, job_id)) >= 2, 60, what="training")
    assert first.terminate(timeout=60) == 0  # SIGTERM: checkpoint, release, exit
    assert trainer_pids(job_id) == []
    with stack.sessions() as s:
        job = s.get(Job, job_id)
        assert job.status == "queued" and job.lease_owner is None and job.attempt == 1
    released_at = checkpoint_steps(stack.sessions, job_id)
    assert len(released_at) == 1 and 2 <= released_at[0] < 200
    last = events(stack.sessions, job_id)[-1]
    assert last.kind == "status" and last.data["reason"] == "worker shutting down"
    # The task was sent again, to the job's own queue, for the next worker (which would
    # resume from the checkpoint: see the kill test and the embedded test).
    assert [m["args"] for m in queued_messages(stack.broker_url, "cpu")] == [[job_id]]


def queued_messages(broker_url: str, queue: str) -> list[dict]:
    """The Celery messages waiting in a Redis queue (kombu keeps them in a list)."""
    import base64

    import redis

    client = redis.Redis.from_url(broker_url)
    try:
        raw = client.lrange(queue, 0, -1)
    finally:
        client.close()
    out = []
    for item in raw:
        message = json.loads(item)
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        out.append({"task": message["headers"]["task"], "args": args, "kwargs": kwargs})
    return out
