"""Several nodes that share no disk, on loopback: torchrun agents started exactly as a Kubeflow
TrainJob starts them (torchrun reads PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
PET_MASTER_ADDR and PET_MASTER_PORT, or PET_RDZV_* for c10d rendezvous, as its flags'
defaults), each node with its own scratch directory; spec, data, checkpoints, export and rank 0's
run log all go through the SeaweedFS S3 the tests start (trainer.remote, trainer.ckptio).

* 2 nodes x 1 process train like 1 node x 2 processes and like 1 process (DDP with static
  rendezvous; FSDP with c10d), losses to 1e-5 (fp32);
* one agent killed mid-run: the other fails within a bounded time (the collective timeout)
  instead of hanging; a relaunch with --resume finishes from the last committed checkpoint with
  the weights of an uninterrupted run, at the same world size (bit for bit) and at another
  (within WORLD_CHANGE_ATOL: DCP reshards; tests/trainer/test_fsdp.py measures 1e-7).
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from contract.runs import COLLECTIVE_TIMEOUT_ENV, HEARTBEAT_FILE
from trainer.checkpoint import read_weights
from worker.launch import free_port
from worker.routing import Placement, trainer_env

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LOSS_RTOL = 1e-5
WORLD_CHANGE_ATOL = 1e-6
AGENT_TIMEOUT_S = 300  # every agent runs under `timeout`: a hang fails the test, never CI


@pytest.fixture
def store(s3_server, monkeypatch, tmp_path):
    """(bucket URL, env with the store's credentials) and the spec's data uploaded to it."""
    bucket = s3_server.new_bucket("multinode")
    env = {
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
        "AWS_ENDPOINT_URL_S3": s3_server.endpoint_url,
        "AWS_DEFAULT_REGION": s3_server.region,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return f"s3://{bucket}", env, s3_server.client(), bucket


def _put(client, bucket: str, key: str, data: bytes) -> str:
    client.put_object(Bucket=bucket, Key=key, Body=data)
    return f"s3://{bucket}/{key}"


def _spec_url(store, make_spec, pref_file, name: str, **kw) -> str:
    _, _, client, bucket = store
    data = _put(client, bucket, "team/files/pref.jsonl", Path(pref_file).read_bytes())
    spec = make_spec(training_file=data, max_steps=6, checkpoint_every=2, **kw)
    return _put(
        client, bucket, f"team/{name}/run/attempt-1/spec.json", spec.model_dump_json().encode()
    )


def _fs():
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    return fs


def agents(store, spec_url: str, job: str, tmp: Path, nodes: int, nproc: int, *,
           rdzv: str = "static", resume: bool = False) -> list[subprocess.Popen]:  # fmt: skip
    """One torchrun agent per node, with the environment a TrainJob's pods get."""
    base, env_s3, _, _ = store
    port = free_port()
    procs = []
    for node in range(nodes):
        env = {**trainer_env(Placement(nproc, cpu=True)), **env_s3, "OMP_NUM_THREADS": "1"}
        env |= {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(nproc)}
        env[COLLECTIVE_TIMEOUT_ENV] = "20"
        if rdzv == "static":
            env |= {"PET_NODE_RANK": str(node), "PET_MASTER_ADDR": "127.0.0.1",
                    "PET_MASTER_PORT": str(port)}  # fmt: skip
        else:
            env |= {"PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": f"127.0.0.1:{port}",
                    "PET_RDZV_ID": job}  # fmt: skip
        argv = ["timeout", str(AGENT_TIMEOUT_S), sys.executable, "-m", "torch.distributed.run",
                "-m", "trainer", "run", spec_url, "--out", str(tmp / f"{job}-node{node}"),
                "--no-progress", "--checkpoints", f"{base}/team/{job}/",
                "--final", f"{base}/team/{job}/final/",
                "--runlog", f"{base}/team/{job}/run/attempt-1/"]  # fmt: skip
        if resume:
            argv.append("--resume")
        procs.append(
            subprocess.Popen(
                argv,
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )  # fmt: skip
        )
    return procs


def kill_node(proc: subprocess.Popen) -> None:
    """SIGKILL the agent and every process under it, as a node loss does (torchrun starts its
    ranks in sessions of their own, so the agent's process group alone misses them)."""
    import psutil

    root = psutil.Process(proc.pid)
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)


def finish(procs: list[subprocess.Popen]) -> None:
    outs = [p.communicate(timeout=AGENT_TIMEOUT_S + 30)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-4000:]


def losses(store, job: str) -> list[float]:
    """Rank 0's losses, as the control plane reads them: from the mirrored run log."""
    base = store[0]
    text = _fs().cat(f"{base}/team/{job}/run/attempt-1/metrics.jsonl").decode()
    return [json.loads(ln)["loss"] for ln in text.splitlines()]


def final_weights(store, job: str, step: int = 6) -> dict[str, torch.Tensor]:
    return read_weights(f"{store[0]}/team/{job}/step-{step}")


def _close(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b) == 6
    assert a == pytest.approx(b, rel=LOSS_RTOL, abs=1e-7)


def test_two_nodes_equal_one_node_and_one_process_ddp_static(store, make_spec, pref_file, tmp_path):
    spec = _spec_url(store, make_spec, pref_file, "ddp")
    finish(agents(store, spec, "ddp-2x1", tmp_path, nodes=2, nproc=1))
    finish(agents(store, spec, "ddp-1x2", tmp_path, nodes=1, nproc=2))
    finish(agents(store, spec, "ddp-1x1", tmp_path, nodes=1, nproc=1))
    two_nodes = losses(store, "ddp-2x1")
    _close(two_nodes, losses(store, "ddp-1x2"))
    _close(two_nodes, losses(store, "ddp-1x1"))
    # the run log the control plane reads: a heartbeat at the last step, and the result
    base = store[0]
    beat = json.loads(_fs().cat(f"{base}/team/ddp-2x1/run/attempt-1/{HEARTBEAT_FILE}"))
    assert beat["step"] == 6
    result = json.loads(_fs().cat(f"{base}/team/ddp-2x1/run/attempt-1/result.json"))
    assert result["status"] == "succeeded"
    # the export went to the store, committed, and no node's scratch holds a checkpoint
    assert _fs().exists(f"{base}/team/ddp-2x1/final/_COMPLETE")
    assert not (tmp_path / "ddp-2x1-node1" / "checkpoints").exists()


def test_fsdp_two_nodes_c10d_equal_one_process_and_survive_a_lost_node(
    store, make_spec, pref_file, tmp_path
):
    spec = _spec_url(store, make_spec, pref_file, "fsdp", parallelism={"strategy": "fsdp"})
    finish(agents(store, spec, "whole", tmp_path, nodes=2, nproc=1, rdzv="c10d"))
    finish(agents(store, spec, "one", tmp_path, nodes=1, nproc=1))
    _close(losses(store, "whole"), losses(store, "one"))
    uninterrupted = final_weights(store, "whole")

    # a node lost after the step-2 checkpoint is committed: once rank 0 has logged step 3
    procs = agents(store, spec, "lost", tmp_path, nodes=2, nproc=1)
    metrics = tmp_path / "lost-node0" / "metrics.jsonl"
    deadline = time.monotonic() + AGENT_TIMEOUT_S
    while not metrics.exists() or metrics.read_text().count("\n") < 3:
        assert time.monotonic() < deadline and procs[0].poll() is None, "no step 3"
        time.sleep(0.05)
    kill_node(procs[1])
    t0 = time.monotonic()
    out = procs[0].communicate(timeout=AGENT_TIMEOUT_S)[0]
    waited = time.monotonic() - t0
    assert procs[0].returncode not in (0, 124), out[-3000:]  # failed, and not by `timeout`
    assert waited < 120, f"the surviving node took {waited:.0f} s to fail"
    procs[1].wait()

    # the control plane's retry: only committed checkpoints count, so copy what a retry sees
    fs = _fs()
    base = f"{store[0]}/team"
    steps = sorted(p.rsplit("-", 1)[-1] for p in fs.ls(f"{base}/lost/") if "/step-" in p)
    committed = [s for s in steps if fs.exists(f"{base}/lost/step-{s}/_COMPLETE")]
    assert committed and int(max(committed, key=int)) < 6
    for job in ("same", "other"):
        for s in committed:
            fs.copy(f"{base}/lost/step-{s}", f"{base}/{job}/step-{s}", recursive=True)
    finish(agents(store, spec, "same", tmp_path, nodes=2, nproc=1, resume=True))
    finish(agents(store, spec, "other", tmp_path, nodes=1, nproc=1, resume=True))
    for job in ("same", "other"):  # they continued from the checkpoint, not from scratch
        text = fs.cat(f"{base}/{job}/run/attempt-1/metrics.jsonl").decode()
        assert json.loads(text.splitlines()[0])["step"] == int(max(committed, key=int)) + 1
    same, other = final_weights(store, "same"), final_weights(store, "other")
    assert same.keys() == uninterrupted.keys() == other.keys()
    assert all(torch.equal(same[k], uninterrupted[k]) for k in same)
    worst = max((other[k] - uninterrupted[k]).abs().max().item() for k in other)
    assert worst <= WORLD_CHANGE_ATOL, worst


def test_a_checkpoint_torn_before_its_commit_is_swept(
    store, make_spec, pref_file, tmp_path, db_sessions, s3_server
):
    """Every rank wrote its DCP shards to the store, the marker never came (a crash between the
    shard writes and the commit): no resume takes it, and once the job is over and the grace
    period past, the storage sweeper removes it and keeps the committed, recorded one."""
    from models.tables import Checkpoint, Job
    from models.teams import create_team
    from storage.keys import checkpoint_prefix
    from trainer import checkpoint
    from trainer.train import train
    from worker.sweeper import sweep

    base, _, client, bucket = store
    with db_sessions() as s:
        team = create_team(s, "torn-dcp").id
        job = Job(team_id=team, status="running", spec={}, base_model="tiny-llama",
                  objective="dpo")  # fmt: skip
        s.add(job)
        s.commit()
        job_id = job.id
    root = f"{base}/{team}/{job_id}/"
    spec = make_spec(max_steps=4, checkpoint_every=2)
    train(spec, tmp_path / "run", progress=False, checkpoints=root)
    torn = checkpoint_prefix(team, job_id, 4)
    client.delete_object(Bucket=bucket, Key=torn + "_COMPLETE")
    _fs()
    assert checkpoint.latest(root).step == 2  # never resumed
    with db_sessions() as s:
        s.add(Checkpoint(job_id=job_id, step=2, object_prefix=checkpoint_prefix(team, job_id, 2)))
        s.get(Job, job_id).status = "failed"
        s.commit()

    def keys(prefix: str) -> list[str]:
        found = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        return [o["Key"] for o in found]

    assert keys(torn)  # the shards are there, uncommitted
    sweep(db_sessions, s3_server.store(bucket), grace_seconds=60, now=time.time() + 120)
    assert keys(torn) == []
    assert checkpoint_prefix(team, job_id, 2) + "_COMPLETE" in keys(
        checkpoint_prefix(team, job_id, 2)
    )
