"""Queues, process counts, devices and the trainer command line (multi-GPU cannot run here:
its command is checked instead), and the JSONL tail."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.config import WorkerSettings
from worker.launch import trainer_command
from worker.routing import (
    PROJECT_ROOT,
    Placement,
    PlacementError,
    placement,
    queue_for,
    trainer_env,
)
from worker.tail import JsonlTail

CPU_MODELS = frozenset({"tiny-llama"})


@pytest.mark.parametrize(
    ("base_model", "metadata", "queue"),
    [
        ("tiny-llama", {}, "cpu"),
        ("smollm2-135m-instruct", {}, "gpu"),
        ("smollm2-135m-instruct", {"gpus": "0"}, "cpu"),
        ("tiny-llama", {"gpus": "2"}, "gpu"),
        ("tiny-llama", {"gpus": "lots"}, "cpu"),  # malformed: the runner fails it; model routes
        ("smollm2-135m-instruct", None, "gpu"),
    ],
)
def test_queue_for(base_model, metadata, queue):
    assert queue_for(base_model, metadata, CPU_MODELS) == queue


def test_placement():
    gpus = ["0", "1", "2", "3"]
    assert placement({}, None) == Placement(1)  # WORKER_GPUS unset: the worker's devices
    assert placement({}, []) == Placement(1, cpu=True)  # WORKER_GPUS=none
    assert placement({}, gpus) == Placement(4, ("0", "1", "2", "3"))
    assert placement({"gpus": "2"}, gpus) == Placement(2, ("0", "1"))
    assert placement({"gpus": "1"}, None) == Placement(1)
    assert placement({"gpus": "0"}, []) == Placement(1, cpu=True)
    # Resuming keeps the checkpoint's process count, whatever the worker has or the job says.
    assert placement({"gpus": "4"}, gpus, resume_world_size=2) == Placement(2, ("0", "1"))
    assert placement({}, [], resume_world_size=2) == Placement(2, cpu=True)  # DDP on CPU
    with pytest.raises(PlacementError, match="needs 8 GPUs"):
        placement({"gpus": "8"}, gpus)
    with pytest.raises(PlacementError, match="written by 8"):
        placement({}, gpus, resume_world_size=8)
    with pytest.raises(PlacementError, match="has none"):
        placement({"gpus": "2"}, [])
    with pytest.raises(PlacementError, match="set WORKER_GPUS"):
        placement({"gpus": "2"}, None)
    with pytest.raises(PlacementError, match="non-negative integer"):
        placement({"gpus": "-1"}, gpus)


def test_single_process_command(tmp_path):
    cmd = trainer_command(
        "/py", tmp_path / "spec.json", tmp_path / "run", resume=False, place=Placement(1)
    )
    assert cmd == [
        "/py", "-m", "trainer", "run", str(tmp_path / "spec.json"),
        "--out", str(tmp_path / "run"), "--no-progress",
    ]  # fmt: skip
    resumed = trainer_command("/py", Path("s"), Path("r"), resume=True, place=Placement(1, ("0",)))
    assert resumed[-1] == "--resume" and "accelerate.commands.launch" not in resumed


def test_multi_gpu_command_uses_accelerate_launch():
    place = placement({"gpus": "2"}, ["4", "5", "6"])
    cmd = trainer_command(
        "/py", Path("/w/spec.json"), Path("/w/run"), resume=True, place=place,
        main_process_port=29612,
    )  # fmt: skip
    assert cmd == [
        "/py", "-m", "accelerate.commands.launch",
        "--num_processes", "2", "--num_machines", "1", "--main_process_port", "29612",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--multi_gpu",
        "-m", "trainer", "run", "/w/spec.json", "--out", "/w/run", "--no-progress", "--resume",
    ]  # fmt: skip
    env = trainer_env(place, base={"PATH": "/bin", "PYTHONPATH": "/x"})
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert env["PYTHONPATH"].split(":") == [str(PROJECT_ROOT), "/x"]
    assert env["PATH"] == "/bin"


def test_multi_process_cpu_command_and_ports():
    cmd = trainer_command("/py", Path("s"), Path("r"), resume=False, place=Placement(2, cpu=True))
    # torchrun, not `accelerate launch --cpu` (which starts one process unless MPI is installed)
    assert cmd[:3] == ["/py", "-m", "torch.distributed.run"] and "--cpu" not in cmd
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2"
    assert cmd[-7:] == ["-m", "trainer", "run", "s", "--out", "r", "--no-progress"]
    port = int(cmd[cmd.index("--master-port") + 1])
    assert 1024 < port < 65536
    assert trainer_env(Placement(1, cpu=True), base={})["CUDA_VISIBLE_DEVICES"] == ""  # hidden
    inherited = trainer_env(Placement(1), base={"CUDA_VISIBLE_DEVICES": "3"})
    assert inherited["CUDA_VISIBLE_DEVICES"] == "3"


def test_worker_settings():
    s = WorkerSettings(WORKER_GPUS="ids: 0, 1", LEASE_SECONDS=5, HEARTBEAT_SECONDS=30)
    assert s.gpu_ids == ["0", "1"]
    assert WorkerSettings(WORKER_GPUS="").gpu_ids is None
    assert WorkerSettings(WORKER_GPUS="none").gpu_ids == []
    assert s.heartbeat_seconds == pytest.approx(5 / 3)  # never slower than a third of the lease
    assert WorkerSettings(LEASE_SECONDS=120, HEARTBEAT_SECONDS=30).heartbeat_seconds == 30
    assert "tiny-llama" in WorkerSettings().cpu_models


def test_tail_returns_complete_lines_only(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = JsonlTail(path)
    assert tail.read() == []  # not there yet
    path.write_text('{"step": 1}\n{"step": 2')
    assert tail.read() == [{"step": 1}]
    assert tail.read() == []
    with open(path, "a") as fh:
        fh.write('}\nnot json\n{"step": 3}\n')
    assert tail.read() == [{"step": 2}, {"step": 3}]
    path.write_text('{"step": 1}\n')  # rewritten shorter: read from the start again
    assert tail.read() == [{"step": 1}]


def test_python_m_worker_defaults():
    from worker.__main__ import default_args

    assert default_args([]) == ["worker", "-Q", "celery,cpu,gpu", "--pool=solo", "-c", "1"]
    assert default_args(["-Q", "gpu", "--pool=prefork", "-c", "2", "-n", "x@%h"]) == [
        "worker", "-Q", "gpu", "--pool=prefork", "-c", "2", "-n", "x@%h",
    ]  # fmt: skip
