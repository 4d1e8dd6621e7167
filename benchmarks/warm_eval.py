"""Warm evaluation start-up (EVAL_WARM_START, worker.warm) against a fresh interpreter per
evaluation, side by side through the product's path (api.embedded: API, in-process worker,
evaluations of tiny-llama on examples/data/math_eval_small.jsonl, one after another).

    python benchmarks/warm_eval.py [--quick] [--evaluations N]

Per evaluation: the wall-clock from its creation to its end, as a client sees it. The warm
mode's first evaluation also starts the warm process (it imports torch and transformers
once): reported apart, and the steady state is the mean of the others. Every evaluation of
both modes must give the same metrics. The last line is one JSON object: each figure with its
target (warm steady state ÷ cold ≤ 0.5).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "client"))

DATA = REPO / "examples" / "data" / "math_eval_small.jsonl"
TARGET_RATIO = 0.5


def one_mode(root: Path, warm: bool, n: int) -> tuple[list[float], list[Any]]:
    """(seconds per evaluation, their metrics) in one embedded service."""
    from api.embedded import EmbeddedService

    env = {"EVAL_WARM_START": "1" if warm else "0", "EVAL_SAMPLING_ENGINE": "hf"}
    with EmbeddedService(root, team="bench", env=env) as service:
        from humanline_client import Client

        client = Client(base_url=service.base_url, api_key=service.key, timeout=120)
        file_id = client.files.upload(file=DATA, purpose="eval").id
        seconds, metrics = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            ev = client.evaluations.create(
                base_model="tiny-llama", file_id=file_id, kind="math", max_items=4,
                generation={"max_new_tokens": 16},
            )  # fmt: skip
            ev = client.evaluations.wait(ev.id, timeout=600)
            seconds.append(time.perf_counter() - t0)
            if ev.status != "succeeded":
                raise RuntimeError(f"evaluation {ev.id} {ev.status}: {ev.error}")
            metrics.append(ev.result["metrics"])
    return seconds, metrics


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 evaluations a mode (< 60 s)")
    ap.add_argument("--evaluations", type=int, help="evaluations a mode (default 8; quick 3)")
    args = ap.parse_args(argv)
    n = args.evaluations or (3 if args.quick else 8)
    with tempfile.TemporaryDirectory(prefix="warm-eval-") as tmp:
        cold_s, cold_m = one_mode(Path(tmp) / "cold", False, n)
        warm_s, warm_m = one_mode(Path(tmp) / "warm", True, n)
    cold = statistics.mean(cold_s)
    steady = statistics.mean(warm_s[1:])
    same = all(m == cold_m[0] for m in cold_m + warm_m)
    summary = {
        "evaluations_per_mode": n,
        "cold_s_per_evaluation": round(cold, 2),
        "warm_first_s": round(warm_s[0], 2),
        "warm_s_per_evaluation": round(steady, 2),
        "warm_over_cold": round(steady / cold, 3),
        "warm_over_cold_target": f"<= {TARGET_RATIO}",
        "warm_over_cold_ok": steady / cold <= TARGET_RATIO,
        "same_metrics": same,
        "same_metrics_target": True,
    }
    print(json.dumps(summary))
    return 0 if summary["warm_over_cold_ok"] and same else 1


if __name__ == "__main__":
    raise SystemExit(main())
