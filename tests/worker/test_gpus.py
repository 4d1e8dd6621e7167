"""WORKER_GPUS means one thing per value, and a job placed on GPUs its trainer cannot see fails
loudly instead of training on CPU (issue 11, findings 3 and 5). No GPU here: torch's device
count is faked in the probe's child process (a stub `torch` package on PYTHONPATH) or the
probe is replaced."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from worker import gpus
from worker.config import WorkerSettings
from worker.gpus import WorkerGpus, parse_worker_gpus, place_attempt, worker_gpu_ids
from worker.routing import Placement, PlacementError

SMOL = {"base_model": "smollm2-135m-instruct"}  # routed to the gpu queue
TINY_SPEC = {"base_model": "tiny-llama"}  # routed to the cpu queue


@pytest.fixture(autouse=True)
def _fresh_probe():
    gpus.clear_probe_cache()
    yield
    gpus.clear_probe_cache()


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("", WorkerGpus("inherit")),
        ("none", WorkerGpus("none")),
        ("CPU", WorkerGpus("none")),
        ("all", WorkerGpus("all")),
        ("count:8", WorkerGpus("count", count=8)),
        (" ids: 0, 1 ", WorkerGpus("ids", ids=("0", "1"))),
        ("ids:GPU-5c3a1f,MIG-2b", WorkerGpus("ids", ids=("GPU-5c3a1f", "MIG-2b"))),
    ],
)
def test_worker_gpus_forms(value, parsed):
    assert parse_worker_gpus(value) == parsed


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("8", "ambiguous: write count:8 for 8 GPUs or ids:8 for the GPU with id 8"),
        ("0", "ambiguous: write count:0 for 0 GPUs or ids:0"),
        ("0,1,2,3", "ambiguous: write ids:0,1,2,3"),
        ("count:0", "count:N needs a whole number N >= 1"),
        ("count:two", "count:N needs a whole number"),
        ("ids:", "ids: needs device ids"),
        ("ids:0,,1", "ids: needs device ids"),
        ("ids:0,0", "listed twice"),
        ("gpu0", "not understood"),
    ],
)
def test_ambiguous_or_malformed_values_are_refused(value, message):
    with pytest.raises(ValueError, match=message):
        parse_worker_gpus(value)


def test_a_worker_with_a_bare_number_does_not_start():
    """The settings are validated when the worker imports them (worker.celery_app)."""
    with pytest.raises(ValidationError, match="ambiguous: write count:8"):
        WorkerSettings(WORKER_GPUS="8")
    env = {"WORKER_GPUS": "8", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", "import worker.celery_app"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode != 0 and "WORKER_GPUS='8' is ambiguous" in out.stderr


def test_count_takes_the_first_n_visible_devices():
    count = WorkerGpus("count", count=2)
    assert worker_gpu_ids(count, "py", {}) == ["0", "1"]
    assert worker_gpu_ids(count, "py", {"CUDA_VISIBLE_DEVICES": "4,5,6"}) == ["4", "5"]
    with pytest.raises(PlacementError, match="lists 1 device"):
        worker_gpu_ids(count, "py", {"CUDA_VISIBLE_DEVICES": "3"})
    assert worker_gpu_ids(WorkerGpus("none"), "py", {}) == []
    assert worker_gpu_ids(WorkerGpus("inherit"), "py", {}) is None


def fake_torch(tmp_path, devices: int) -> dict[str, str]:
    """An environment whose `import torch` is a stub reporting `devices` CUDA devices, minus
    any hidden by CUDA_VISIBLE_DEVICES="" (as the real one does)."""
    pkg = tmp_path / "stub" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import os\n"
        "class cuda:\n"
        "    @staticmethod\n"
        "    def device_count():\n"
        "        mask = os.environ.get('CUDA_VISIBLE_DEVICES')\n"
        f"        n = {devices}\n"
        "        return n if mask is None else min(n, len([m for m in mask.split(',') if m]))\n"
        "    @staticmethod\n"
        "    def is_available():\n"
        "        return cuda.device_count() > 0\n"
    )
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(pkg.parent)}


def test_all_counts_the_devices_torch_sees(tmp_path):
    env = fake_torch(tmp_path, 4)
    assert worker_gpu_ids(WorkerGpus("all"), sys.executable, env) == ["0", "1", "2", "3"]
    gpus.clear_probe_cache()
    hidden = {**env, "CUDA_VISIBLE_DEVICES": ""}
    with pytest.raises(PlacementError, match="sees no CUDA device"):
        worker_gpu_ids(WorkerGpus("all"), sys.executable, hidden)


def test_the_probe_reports_a_broken_torch(tmp_path):
    bad = tmp_path / "torch.py"
    bad.write_text("raise ImportError('libcuda.so.1: cannot open shared object file')\n")
    n, why = gpus.cuda_device_count(sys.executable, {"PYTHONPATH": str(tmp_path)})
    assert n == 0 and "libcuda.so.1" in why


def settings(gpus_value: str, *, embedded: bool = False, python: str = sys.executable):
    return WorkerSettings(
        WORKER_GPUS=gpus_value,
        TRAINER_PYTHON=python,
        BROKER_URL="memory://" if embedded else "redis://broker:6379/0",
    )


@pytest.fixture
def devices(monkeypatch):
    """Fake probe: `seen[0]` devices whatever the mask; records the masks it was asked."""
    asked: list[str | None] = []
    seen = [0]

    def probe(python, env):
        asked.append(env.get("CUDA_VISIBLE_DEVICES"))
        mask = env.get("CUDA_VISIBLE_DEVICES")
        visible = seen[0] if mask is None else min(seen[0], len([m for m in mask.split(",") if m]))
        return visible, "" if visible else "torch.cuda.is_available() is False"

    monkeypatch.setattr(gpus, "cuda_device_count", probe)
    return seen, asked


def test_gpu_queue_job_on_a_celery_worker_without_cuda_fails(devices):
    seen, _ = devices
    with pytest.raises(PlacementError, match=r"needs 1 CUDA device.*sees 0.*train on CPU"):
        place_attempt(settings(""), SMOL, {}, None)
    seen[0] = 1
    assert place_attempt(settings(""), SMOL, {}, None) == Placement(1)


def test_declared_gpus_must_all_be_seen(devices):
    seen, asked = devices
    seen[0] = 2
    place = place_attempt(settings("count:2"), SMOL, {}, None)
    assert place == Placement(2, ("0", "1")) and asked[-1] == "0,1"
    # Each rank its own device: the 2 processes get 2 distinct ids, never both GPU 0.
    assert len(set(place.gpu_ids)) == place.num_processes
    seen[0] = 1  # a pod that got one GPU where the manifest says two
    with pytest.raises(
        PlacementError, match=r"needs 2 CUDA device.*sees 1.*CUDA_VISIBLE_DEVICES=0,1"
    ):
        place_attempt(settings("count:2"), SMOL, {}, None)
    # Even a cpu-queue job: a worker that says it has GPUs and has none is misconfigured.
    seen[0] = 0
    with pytest.raises(PlacementError, match="sees 0"):
        place_attempt(settings("ids:0"), TINY_SPEC, {}, None)


def test_cpu_only_worker_refuses_gpu_queue_jobs_but_runs_cpu_ones(devices):
    with pytest.raises(PlacementError, match="CPU-only"):
        place_attempt(settings("none"), SMOL, {}, None)
    assert place_attempt(settings("none"), TINY_SPEC, {}, None) == Placement(1, cpu=True)
    assert place_attempt(settings("none"), SMOL, {"gpus": "0"}, None) == Placement(1, cpu=True)


def test_embedded_worker_runs_gpu_queue_models_on_cpu_unless_gpus_are_declared(devices):
    _, asked = devices
    assert place_attempt(settings("", embedded=True), SMOL, {}, None) == Placement(1)
    assert asked == []  # not even probed: the CPU demo path stays as it was
    with pytest.raises(PlacementError, match="needs 1 CUDA device"):  # the job asked for one
        place_attempt(settings("", embedded=True), SMOL, {"gpus": "1"}, None)
    with pytest.raises(PlacementError, match="needs 1 CUDA device"):
        place_attempt(settings("ids:0", embedded=True), SMOL, {}, None)


def test_the_real_probe_on_this_machine_sees_no_gpu_under_an_empty_mask():
    """The real torch in a child process (the trainer's interpreter)."""
    n, why = gpus.cuda_device_count(sys.executable, {"CUDA_VISIBLE_DEVICES": "", "PATH": "/bin"})
    assert n == 0 and why


def test_a_gpu_queue_job_without_a_gpu_fails_with_an_event_and_no_trainer(local):
    """End to end through the Runner, with the real probe (the trainer's own interpreter and
    torch): a Celery worker that has no CUDA device fails the job before starting anything."""
    from worker.runner import Runner

    job_id = local.make_job(base_model="smollm2-135m-instruct", max_steps=1)
    celery = local.settings.model_copy(
        update={
            "BROKER_URL": "redis://broker:6379/0",
            "WORKER_GPUS": "",
            "TRAINER_PYTHON": sys.executable,
        }
    )
    assert Runner(celery, local.sessions, local.store).run(job_id) == "failed"
    job = local.job(job_id)
    assert job.error["type"] == "placement_error"
    assert "needs 1 CUDA device" in job.error["message"] and "train on CPU" in job.error["message"]
    events = local.events(job_id)
    failed = [e for e in events if e.kind == "status" and e.data["to"] == "failed"]
    assert len(failed) == 1 and "needs 1 CUDA device" in failed[0].message
    assert "started" not in [e.kind for e in events]  # no trainer ran
