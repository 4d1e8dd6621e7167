"""The `service` part of benchmarks/gpu_smoke.py: the product itself on the GPU machine.

The other parts call the trainer directly. This one runs what a team does: the embedded server
(API over real HTTP, SQLite, the local object store, the in-process worker - the same Runner as
the Celery workers, which starts every attempt as `python -m trainer run` with
CUDA_VISIBLE_DEVICES from WORKER_GPUS) driven through the Python SDK: upload preference data
and eval files, submit a humanline DPO job with a checkpoint and two evaluations of its final
model (math, and instruction judged by a reward model), wait, then read back what a user reads:
the job's events (where it trained), its checkpoints, the exported model, and both reports.

On a GPU the worker declares its GPUs (WORKER_GPUS=all) and the job must train on `cuda`; in
the self-check the worker is CPU-only (WORKER_GPUS=none) and the same flow must say `cpu`.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from gpu_models import reward_model

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "examples" / "data"


def part_service(r, s) -> None:
    from api.embedded import EmbeddedService
    from humanline_client import Client

    gpu = torch.cuda.is_available()
    rm = reward_model(s.work / "rm-service", s.small)
    env = {
        "ALLOWED_BASE_MODELS": str(s.small),
        "EVAL_REWARD_MODELS": f"rm={rm}",
        "WORKER_GPUS": "all" if gpu else "none",
        "WORKER_CPU_MODELS": "tiny-llama",  # the random SmolLM2 shape goes to the gpu queue
    }
    t0 = time.perf_counter()
    with EmbeddedService(s.work / "service", team="gpu-proof", env=env) as service:
        with Client(base_url=service.base_url, api_key=service.key) as client:
            _drive(r, s, client, expect="cuda" if gpu else "cpu")
    r.figure("service.seconds", time.perf_counter() - t0)


def _drive(r, s, client, expect: str) -> None:
    pairs = client.files.upload(file=s.pairs, purpose="train")
    math = client.files.upload(file=DATA / "math_eval_small.jsonl", purpose="eval")
    chat = client.files.upload(file=DATA / "instruction_eval_small.jsonl", purpose="eval")
    gen = {"max_new_tokens": 16}
    job = client.jobs.create(
        base_model=str(s.small),
        training_file=pairs.id,
        objective="dpo",
        variant="offline+humanline",
        batch_size=s.batch,
        max_steps=s.steps,
        checkpoint_every=s.steps // 2,
        max_prompt_length=s.plen + 16,
        max_length=s.plen + s.clen + 32,
        precision=s.precision,
        quality_sample=0,
        adapter={"kind": "none"},
        optim={"lr": 1e-5, "warmup_ratio": 0.0},
        evaluations=[
            {"file_id": math.id, "kind": "math", "generation": {**gen, "n": 2}},
            {
                "file_id": chat.id,
                "kind": "instruction",
                "judge": {"type": "reward_model", "model": "rm"},
                "generation": gen,
            },
        ],
    )
    done = client.jobs.wait(job.id, progress=False, timeout=900, poll_interval=0.5)
    r.figure("service.job_status", done.status, "succeeded", done.status == "succeeded")
    if done.status != "succeeded":
        raise RuntimeError(f"job {job.id} {done.status}: {done.error}")
    started = [e for e in client.jobs.events(job.id, limit=100) if e.kind == "started"]
    device = (started[-1].data or {}).get("device") if started else None
    r.figure("service.trained_on", device, expect, device == expect)
    steps = sorted(c.step for c in client.jobs.checkpoints(job.id))
    want = [s.steps // 2, s.steps]
    r.figure("service.checkpoint_steps", steps, str(want), steps == want)
    model = client.jobs.download_model(job.id, s.work / "service-model", progress=False)
    weights = (model / "model.safetensors").is_file()
    r.figure("service.model_has_weights", weights, "true", weights)
    deadline = time.time() + 600
    evals = list(client.evaluations.list(job_id=job.id))
    while len(evals) < 2 and time.time() < deadline:  # queued as the job concludes
        time.sleep(0.5)
        evals = list(client.evaluations.list(job_id=job.id))
    results = {}
    for e in evals:
        left = max(1.0, deadline - time.time())
        e = client.evaluations.wait(e.id, timeout=left, poll_interval=0.5)
        results[e.kind] = e
    for kind in ("math", "instruction"):
        e = results.get(kind)
        status = e.status if e else "missing"
        r.figure(f"service.eval_{kind}", status, "succeeded", status == "succeeded")
        if e is not None and e.status == "succeeded":
            where = (e.result or {}).get("generation", {}).get("device")
            r.figure(f"service.eval_{kind}.generated_on", where, expect, where == expect)
            metrics = (e.result or {}).get("metrics", {})
            r.figure(f"service.eval_{kind}.metrics", sorted(metrics))
