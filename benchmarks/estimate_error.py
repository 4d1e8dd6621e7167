"""How far the cost estimate (contract/estimate.py, POST /v1/jobs/estimate) is from real runs.

Runs small real jobs of the kinds `make test` runs (tiny-llama on CPU, one process: DPO full
fine-tuning, DPO offline+humanline with LoRA, KTO, offline GRPO) each as `python -m trainer
run SPEC --out DIR` in a fresh process, as the worker runs it, and compares per job:

* steps: predicted ÷ the steps trained (target: exact);
* tokens: predicted ÷ the trainer's count (tokens_per_s × step_time summed over the steps,
  reports.estimate.measured_tokens); the estimate approximates tokens from the file's bytes
  (target within [0.67, 1.5]);
* wall-clock: predicted ÷ measured, the process from start to exit (target within [0.5, 2] on
  CPU: a shared 2-vCPU machine moves step times by 1.5x from run to run);
* memory: contract.memory's estimate for the chosen micro-batch ÷ the process's peak RSS
  (the child's ru_maxrss from wait4; target within [0.67, 1.5]).

`--calibrate` prints the CPU row of contract/throughput.json the runs imply (effective FLOP/s,
fixed seconds per step and per process start) and tiny-llama's bytes per token; the figures
committed there came from it. `--quick` runs 3 jobs of 6 steps (< 60 s); the full run 4 jobs of
16 steps. The last line printed is one JSON object: each figure, its target, and `met`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
DATA = REPO / "examples" / "data" / "preferences.jsonl"
TARGETS = {"steps": (1.0, 1.0), "tokens": (0.67, 1.5), "wall_clock": (0.5, 2.0),
           "memory": (0.67, 1.5)}  # fmt: skip
JOBS: dict[str, dict[str, Any]] = {
    "dpo.full": {"objective": "dpo"},
    "dpo.humanline.lora": {
        "objective": "dpo", "variant": "offline+humanline",
        "adapter": {"kind": "lora", "r": 8, "alpha": 16},
    },
    "kto.full": {"objective": "kto"},
    "grpo.offline": {"objective": "grpo"},
}  # fmt: skip
QUICK_JOBS = ("dpo.full", "dpo.humanline.lora", "kto.full")


def _spec(name: str, steps: int) -> dict[str, Any]:
    return {
        "base_model": "tiny-llama",
        "training_file": str(DATA),
        "batch_size": 4,
        "max_steps": steps,
        "max_length": 256,
        "max_prompt_length": 128,
        "quality_sample": 0,
        "seed": 0,
        **JOBS[name],
    }


def predict(body: dict[str, Any]) -> Any:
    """The estimate the API would make (same spec resolution, CPU queue, one process)."""
    from api.caps import model_shape
    from contract.estimate import estimate_job
    from contract.memory import GiB
    from contract.spec import JobSpec

    spec = JobSpec.model_validate(body).resolved()
    shape = model_shape(spec.base_model)
    assert shape is not None
    lines = [ln for ln in DATA.read_bytes().splitlines() if ln.strip()]
    return estimate_job(
        spec, shape, file_format="preference", file_bytes=DATA.stat().st_size,
        records=len(lines), device="cpu", processes=1, memory_bytes=512 * GiB,
    )  # fmt: skip


def measure(body: dict[str, Any]) -> dict[str, Any]:
    from reports.estimate import measured_tokens

    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out, log = Path(tmp, "spec.json"), Path(tmp, "run"), Path(tmp, "log")
        spec_path.write_text(json.dumps(body))
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        command = [sys.executable, "-m", "trainer", "run", str(spec_path), "--out", str(out),
                   "--no-progress"]  # fmt: skip
        t0 = time.perf_counter()
        with log.open("w") as sink:
            child = subprocess.Popen(command, cwd=REPO, env=env, stdout=sink, stderr=sink)
            _, status, usage = os.wait4(child.pid, 0)  # this child's own peak RSS (KiB)
        wall = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            raise RuntimeError(f"trainer failed ({child.returncode}): {log.read_text()[-2000:]}")
        peak = usage.ru_maxrss * 1024
        metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
        steps = max(int(m["step"]) for m in metrics)
        step_times = [float(m["step_time"]) for m in metrics]
        return {
            "steps": steps,
            "tokens": measured_tokens(metrics, steps),
            "wall_clock": wall,
            "memory": peak,
            "train_seconds": sum(step_times),
            "median_step_s": statistics.median(step_times),
        }


def _ratio(pred: float, real: float | None) -> float | None:
    return round(pred / real, 3) if real else None


def run_job(name: str, steps: int) -> dict[str, Any]:
    body = _spec(name, steps)
    est = predict(body)
    real = measure(body)
    from contract.memory import GiB

    ratios = {
        "steps": _ratio(est.steps, real["steps"]),
        "tokens": _ratio(est.tokens, real["tokens"]),
        "wall_clock": _ratio(est.wall_clock_seconds, real["wall_clock"]),
        "memory": _ratio(est.memory_gib_per_process * GiB, real["memory"]),
    }
    return {
        "job": name,
        "predicted": {"steps": est.steps, "tokens": est.tokens,
                      "wall_clock_s": est.wall_clock_seconds,
                      "train_s": est.train_seconds, "train_flops": est.train_flops,
                      "memory_gib": est.memory_gib_per_process},
        "measured": {"steps": real["steps"], "tokens": real["tokens"],
                     "wall_clock_s": round(real["wall_clock"], 3),
                     "train_s": round(real["train_seconds"], 3),
                     "memory_gib": round(real["memory"] / GiB, 3)},
        "ratio": ratios,
    }  # fmt: skip


def summary(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure: the worst ratio (farthest from 1), the target and whether every job met it."""
    out: dict[str, Any] = {}
    for figure, (low, high) in TARGETS.items():
        values = [j["ratio"][figure] for j in jobs if j["ratio"][figure] is not None]
        worst = max(values, key=lambda r: max(r, 1 / r)) if values else None
        out[figure] = {
            "ratios": values,
            "worst": worst,
            "target": f"in [{low}, {high}]" if low != high else "exact",
            "met": bool(values) and all(low <= v <= high for v in values),
        }
    return out


def calibration(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """The CPU figures these runs imply: effective FLOP/s over the steps, and the fixed start."""
    flops = sum(j["predicted"]["train_flops"] for j in jobs)
    train = sum(j["measured"]["train_s"] for j in jobs)
    start = [j["measured"]["wall_clock_s"] - j["measured"]["train_s"] for j in jobs]
    tokens = [j["measured"]["tokens"] / j["predicted"]["tokens"] for j in jobs]
    return {
        "effective_flops_per_s": flops / train if train else None,
        "startup_seconds": statistics.median(start),
        "tokens_measured_over_predicted": tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="3 jobs of 6 steps (< 60 s).")
    ap.add_argument("--steps", type=int, default=None, help="Steps a job (6 quick, 16 full).")
    ap.add_argument("--jobs", default=None, help=f"Comma-separated, of: {', '.join(JOBS)}.")
    ap.add_argument("--calibrate", action="store_true", help="Print the CPU figures implied.")
    args = ap.parse_args()
    names = args.jobs.split(",") if args.jobs else QUICK_JOBS if args.quick else tuple(JOBS)
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        ap.error(f"unknown jobs {unknown}; known: {', '.join(JOBS)}")
    steps = args.steps or (6 if args.quick else 16)
    t0 = time.perf_counter()
    jobs = []
    for name in names:
        job = run_job(name, steps)
        print(json.dumps(job), flush=True)
        jobs.append(job)
    result: dict[str, Any] = {
        "benchmark": "estimate_error", "mode": "quick" if args.quick else "full",
        "device": "cpu", "steps_per_job": steps, "jobs": jobs, **summary(jobs),
    }  # fmt: skip
    if args.calibrate:
        result["calibration"] = calibration(jobs)
    result["elapsed_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
