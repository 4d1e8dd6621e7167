"""Where an online run's wall-clock goes: sampling, scoring, training; for sample_every = 1, 8, 64.

Each setting trains the same number of steps on the same prompts (a round samples the data of
its `sample_every` steps, so the volume sampled is the same); what changes is how often the
engine is started on fresh weights and how large its batches are. Settings are run one after
another in this process; shares (ratios within one run) are what to compare.

`--quick` uses tiny-llama, 16 steps and sample_every 1, 8, 16 (< 60 s). The last line printed is
one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
PROMPTS = REPO / "examples" / "data" / "arithmetic_train.jsonl"


def run(model: str, steps: int, sample_every: int, engine: str) -> dict:
    from contract.spec import JobSpec
    from trainer.train import Trainer

    spec = JobSpec.model_validate(
        {
            "base_model": model,
            "training_file": str(PROMPTS),
            "objective": "grpo",
            "variant": "online+humanline",
            "batch_size": 8,
            "max_steps": steps,
            "max_length": 448,
            "max_prompt_length": 400,  # 2 groups of 4
            "adapter": {"kind": "lora", "r": 8, "alpha": 16},
            "humanline_params": {"sync_every": 4},
            "online": {
                "num_samples": 4,
                "max_new_tokens": 24,
                "sample_every": sample_every,
                "engine": engine,
                "tau": 0.0,
            },
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(spec, Path(tmp), progress=False)
        t0 = time.perf_counter()
        rows = [trainer.step(s) for s in range(1, steps + 1)]
        wall = time.perf_counter() - t0
        trainer.data.close()
    sample = sum(r.get("round/sample_time", 0.0) for r in rows)
    score = sum(r.get("round/score_time", 0.0) for r in rows)
    rounds = sum("round/index" in r for r in rows)
    return {
        "sample_every": sample_every,
        "rounds": rounds,
        "wall_s": wall,
        "sample_s": sample,
        "score_s": score,
        "train_s": wall - sample - score,
        "sample_share": sample / wall,
        "score_share": score / wall,
        "train_share": (wall - sample - score) / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--engine", default="auto", choices=["auto", "hf", "vllm"])
    args = ap.parse_args()
    steps, settings = (16, (1, 8, 16)) if args.quick else (64, (1, 8, 64))
    results = []
    for every in settings:
        r = run(args.model, steps, every, args.engine)
        results.append(r)
        print(json.dumps(r), flush=True)
    base = results[0]["sample_s"] + results[0]["score_s"]
    summary = {
        "model": args.model,
        "steps": steps,
        "engine": args.engine,
        "runs": results,
        "sampling_time_vs_every_step": {
            str(r["sample_every"]): (r["sample_s"] + r["score_s"]) / base for r in results
        },
        "target": "report only (DESIGN.md: humanline lets one sample 64x less often without loss)",
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
