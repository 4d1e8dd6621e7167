"""The paper's math claim at small scale, through the product's own job path.

Paper §5 (Figure "math"): sampling GRPO's data S times less often (S× as much data every S
steps, same total) makes online GRPO significantly worse; the humanline variant at the same S
does not degrade. Here, on this CPU, with the real SmolLM2-135M-Instruct and verifiable
arithmetic prompts the repo generates (train and held-out splits, disjoint):

  online           GRPO sampling every step (sample_every 1)
  stale            GRPO sampling every S steps, no humanline (the reference is the policy that
                   sampled the round: a trust region around stale data)
  stale+humanline  the same rounds, humanline on (syncing every k steps, clipping [-1.5, 1.5])

Same seeds, same optimizer steps, same total data per arm. Everything goes through the
service as a user's jobs do (api.embedded: SQLite, local store, in-process worker): the files
are uploaded, each arm is a job spec, held-out pass@1 (math-verify, n samples per problem) is
an evaluation of the base model, of each job's mid-run checkpoint and of its final model, and
the comparison is the service's report (`compare.html` in the run directory).

Figures (last line, one JSON object): per arm pass@1 mean ± SE over seeds (and per seed),
cost (wall-clock, sampling rounds, sampled and trained tokens); the share of the stale→online
gap that stale+humanline closes (target ≥ 0.5) and its sampling rounds ÷ online's (target
≤ 1/S). The saving is in how often the engine samples (rounds), as in the paper: the tokens
sampled are the same. `--quick` runs the same path on tiny-llama in under a minute (its figures
mean nothing: it checks the path).

    python benchmarks/replicate.py [--quick] [--seeds 0 1] [--steps 16] [--stale 8] [--lr 3e-5]
                                   [--eval-size 64]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "client"))

SYSTEM = "Give only the final answer, as a number inside <answer> </answer> tags."
TEMPLATE = "{problem}"


@dataclass
class Setup:
    model: str = "smollm2-135m-instruct"
    steps: int = 16
    stale: int = 8  # S
    sync_every: int = 1  # humanline k
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    prompts_per_step: int = 4
    group: int = 8  # G
    max_new_tokens: int = 32
    lr: float = 3e-5
    kinds: tuple[str, ...] = ("add_sub", "mul", "word")
    train_size: int = 512
    eval_size: int = 64
    eval_samples: int = 4
    eval_points: int = 2  # evaluations along the way, the final model included
    engine: str = "vllm"


def quick_setup() -> Setup:
    return Setup(
        model="tiny-llama", steps=2, stale=2, seeds=[0], prompts_per_step=2, group=2,
        max_new_tokens=4, lr=1e-3, train_size=16, eval_size=4, eval_samples=1, eval_points=1,
        engine="hf",
    )  # fmt: skip


# ---- data: verifiable arithmetic, train and held-out disjoint --------------------------------
def make_files(setup: Setup, out: Path) -> tuple[Path, Path]:
    from trainer import prompts

    makers = {"add_sub": prompts._add_sub, "mul": prompts._mul, "div": prompts._div,
              "word": prompts._word, "precedence": prompts._precedence}  # fmt: skip
    rng = random.Random(2024)
    seen: set[str] = set()
    rows: list[tuple[str, str]] = []
    while len(rows) < setup.train_size + setup.eval_size:
        question, value, *_ = makers[rng.choice(setup.kinds)](rng)
        if question not in seen:
            seen.add(question)
            rows.append((question, prompts.format_answer(value)))
    train, held_out = rows[: setup.train_size], rows[setup.train_size :]
    train_path, eval_path = out / "arithmetic_train.jsonl", out / "arithmetic_heldout.jsonl"
    system = {"role": "system", "content": SYSTEM}
    train_path.write_text(prompts.to_jsonl(
        [{"prompt": [system, {"role": "user", "content": q}], "answer": a} for q, a in train]
    ))  # fmt: skip
    eval_path.write_text(prompts.to_jsonl([{"problem": q, "answer": a} for q, a in held_out]))
    return train_path, eval_path


# ---- the arms as job specs ---------------------------------------------------------------------
ARMS = {"online": (1, False), "stale": (None, False), "stale+humanline": (None, True)}


def job_spec(setup: Setup, arm: str, seed: int, train_id: str) -> dict[str, Any]:
    every, humanline = ARMS[arm]
    return {
        "base_model": setup.model,
        "training_file": train_id,
        "objective": {"name": "grpo"},
        "data_source": "online",
        "humanline": humanline,
        "humanline_params": {"sync_every": setup.sync_every},
        "batch_size": setup.prompts_per_step * setup.group,  # sequences, as the paper counts
        "max_steps": setup.steps,
        "max_length": 128 + setup.max_new_tokens,
        "max_prompt_length": 128,
        "seed": seed,
        "optim": {"lr": setup.lr, "warmup_ratio": 0.0},
        "checkpoint_every": max(1, setup.steps // setup.eval_points),
        "quality_sample": 0,
        "metadata": {"arm": arm, "replicate": "1"},
        "online": {
            "engine": setup.engine,
            "num_samples": setup.group,
            "max_new_tokens": setup.max_new_tokens,
            "sample_every": every or setup.stale,
            "rewards": [{"name": "math_accuracy", "weight": 1.0}],
            "zero_variance_groups": "keep",  # as the paper's math setup
            "vllm": {"enforce_eager": True},
        },
    }


def eval_request(setup: Setup, eval_id: str) -> dict[str, Any]:
    return {
        "file_id": eval_id,
        "kind": "math",
        "system_prompt": SYSTEM,
        "prompt_template": TEMPLATE,
        "generation": {"n": setup.eval_samples, "temperature": 0.7, "top_p": 0.95,
                       "max_new_tokens": setup.max_new_tokens, "seed": 0},
    }  # fmt: skip


# ---- figures -----------------------------------------------------------------------------------
def mean_se(values: list[float]) -> dict[str, float | None]:
    """Mean over seeds and its standard error (None from one seed)."""
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
    return {"mean": statistics.fmean(values), "se": se}


def figures(setup: Setup, results: dict[str, list[dict]], base: float | None) -> dict[str, Any]:
    arms: dict[str, Any] = {}
    for arm, runs in results.items():
        arms[arm] = {
            "pass_at_1": mean_se([r["pass_at_1"] for r in runs]),
            "per_seed": runs,
            **{k: statistics.fmean(r[k] for r in runs)
               for k in ("wall_clock_s", "rounds", "sampled_tokens", "trained_tokens")},
        }  # fmt: skip
    on, st, hl = (arms[a]["pass_at_1"]["mean"] for a in ("online", "stale", "stale+humanline"))
    gap = on - st
    closed = (hl - st) / gap if gap > 0 else None  # no gap: nothing to close
    rounds = arms["stale+humanline"]["rounds"] / max(arms["online"]["rounds"], 1)
    return {
        "setup": asdict(setup),
        "base_pass_at_1": base,
        "arms": arms,
        "gap_online_minus_stale": gap,
        "gap_closed": {
            "value": closed,
            "target": ">= 0.5",
            "met": closed is not None and closed >= 0.5,
        },
        "sampling_rounds_ratio": {
            "value": rounds,
            "target": f"<= 1/{setup.stale}",
            "met": rounds <= 1 / setup.stale + 1e-9,
        },  # fmt: skip
        "seeds": {"value": len(setup.seeds), "target": ">= 2", "met": len(setup.seeds) >= 2},
    }


# ---- the run -----------------------------------------------------------------------------------
def run(setup: Setup, root: Path, quick: bool) -> dict[str, Any]:
    from api.embedded import EmbeddedService

    t0 = time.time()
    env = {"EVAL_SAMPLING_ENGINE": setup.engine, "TOKENIZERS_PARALLELISM": "false"}
    with EmbeddedService(root, team="replicate", env=env) as service:
        from humanline_client import Client

        client = Client(base_url=service.base_url, api_key=service.key, timeout=120)
        train_path, eval_path = make_files(setup, root)
        train = client.files.upload(file=train_path, purpose="train")
        held_out = client.files.upload(file=eval_path, purpose="eval")
        request = eval_request(setup, held_out.id)
        base_eval = None if quick else client.evaluations.create(base_model=setup.model, **request)
        jobs: dict[str, list[str]] = {arm: [] for arm in ARMS}
        for seed in setup.seeds:
            for arm in ARMS:
                spec = job_spec(setup, arm, seed, train.id)
                job = client.jobs.create(**spec, evaluations=[request])
                jobs[arm].append(job.id)
                print(f"queued {arm} seed {seed}: {job.id}", flush=True)
        results: dict[str, list[dict]] = {arm: [] for arm in ARMS}
        for arm, ids in jobs.items():
            for seed, job_id in zip(setup.seeds, ids, strict=True):
                results[arm].append(follow(client, job_id, seed, setup, request))
                print(f"{arm} seed {seed}: {json.dumps(results[arm][-1])}", flush=True)
        base = None
        if base_eval is not None:
            done = client.evaluations.wait(base_eval.id, timeout=3600)
            base = pass_at_1(done)
        all_ids = [i for ids in jobs.values() for i in ids]
        page = client.reports.compare(
            jobs=all_ids, format="html", metric="pass_at_1", file_id=held_out.id,
            to=root / "compare.html",
        )  # fmt: skip
        print(f"comparison report: {page}", flush=True)
    summary = figures(setup, results, base)
    summary["wall_clock_total_s"] = time.time() - t0
    summary["report"] = str(root / "compare.html")
    return summary


def pass_at_1(evaluation: Any) -> float:
    if evaluation.status != "succeeded":
        raise RuntimeError(f"evaluation {evaluation.id} {evaluation.status}: {evaluation.error}")
    value = ((evaluation.result or {}).get("metrics") or {}).get("pass_at_1")
    return float(value["value"] if isinstance(value, dict) else value)


def follow(client: Any, job_id: str, seed: int, setup: Setup, request: dict) -> dict[str, Any]:
    """Wait for one job and its final evaluation; evaluate its mid-run checkpoints too."""
    job = client.jobs.wait(job_id, timeout=7200)
    if job.status != "succeeded":
        raise RuntimeError(f"job {job_id} {job.status}: {job.error}")
    metrics = [m.values | {"step": m.step} for m in client.jobs.metrics(job_id)]
    mid = [c.step for c in client.jobs.checkpoints(job_id) if c.step < setup.steps]
    curve = {}
    for step in mid:
        ev = client.evaluations.create(job_id=job_id, step=step, **request)
        curve[step] = pass_at_1(client.evaluations.wait(ev.id, timeout=3600))
    finals = [e for e in client.evaluations.list(job_id=job_id) if e.step is None]
    final = pass_at_1(client.evaluations.wait(finals[0].id, timeout=3600))
    curve[setup.steps] = final
    started, finished = job.started_at, job.finished_at
    return {
        "seed": seed,
        "job": job_id,
        "pass_at_1": final,
        "curve": curve,
        "wall_clock_s": (finished - started).total_seconds() if started and finished else None,
        "rounds": sum(1 for m in metrics if "round/index" in m),
        "sampled_tokens": sum(m.get("round/sampled_tokens", 0.0) for m in metrics),
        "trained_tokens": sum(
            m.get("tokens_per_s", 0.0) * m.get("step_time", 0.0) for m in metrics
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny-llama, 2 steps: the path only")
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--stale", type=int, help="S: steps per sampling round in the stale arms")
    ap.add_argument("--sync-every", type=int, help="humanline k")
    ap.add_argument("--lr", type=float)
    ap.add_argument("--eval-size", type=int, help="held-out problems (each sampled 4 times)")
    ap.add_argument("--out", type=Path, default=REPO / ".humanline" / "replicate")
    args = ap.parse_args(argv)
    setup = quick_setup() if args.quick else Setup()
    for name in ("seeds", "steps", "stale", "sync_every", "lr", "eval_size"):
        if getattr(args, name) is not None:
            setattr(setup, name, getattr(args, name))
    summary = run(setup, args.out, args.quick)
    summary["mode"] = "quick" if args.quick else "full"
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
