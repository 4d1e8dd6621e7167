"""Peak RSS of a trainer on a large training file (issue 14: "the trainer holds the whole
training file in memory at ~12x its size").

Generates a preference file of about --mb megabytes (long prompts and answers, so the count of
records stays moderate and tokenising takes minutes, not hours), then runs one process per
measurement: `python -m trainer run` on tiny-llama for --steps DPO steps (no quality scoring),
and reads that process's peak RSS (ru_maxrss of the child) and the RSS of an idle process that
only imported the trainer (the runtime's own cost). Run it niced on a shared machine:

    nice -n 10 python benchmarks/train_file_memory.py --mb 64

The last line printed is one JSON object: file bytes, records, peak RSS, the runtime's RSS,
and peak − runtime as a multiple of the file size.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = (
    "the of and to in is that for it as with was on be by at this from or an are which have "
    "not but had his they you were her their one all we can has there been if more when will "
    "would who so no river ocean library autumn bicycle moon coffee robot answer number sum"
).split()


def write_file(path: Path, target_bytes: int, seed: int = 0) -> int:
    """Preference records of ~1-2 KB each until the file reaches `target_bytes`."""
    rng = random.Random(seed)
    records = 0
    with open(path, "w") as fh:
        size = 0
        while size < target_bytes:

            def text(n: int) -> str:
                return " ".join(rng.choice(WORDS) for _ in range(n))

            line = (
                json.dumps({"prompt": text(120), "chosen": text(80), "rejected": text(60)}) + "\n"
            )
            fh.write(line)
            size += len(line.encode())
            records += 1
    return records


RUNTIME = (
    "import resource, trainer.train; "
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=64.0, help="training file size, MB")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--keep", type=Path, default=None, help="reuse/keep the file here")
    ap.add_argument("--quick", action="store_true", help="an 8 MB file, 1 step (< 60 s)")
    args = ap.parse_args()
    if args.quick:
        args.mb, args.steps = 8.0, 1

    with tempfile.TemporaryDirectory(prefix="hl-mem-") as tmp:
        data = args.keep or Path(tmp) / "train.jsonl"
        if not data.exists():
            records = write_file(data, int(args.mb * 1e6))
        else:
            records = sum(1 for _ in open(data, "rb"))
        spec = Path(tmp) / "spec.json"
        spec.write_text(
            json.dumps(
                {
                    "base_model": "tiny-llama",
                    "training_file": str(data),
                    "objective": "dpo",
                    "batch_size": 4,
                    "max_steps": args.steps,
                    "max_length": 512,
                    "max_prompt_length": 256,
                    "quality_sample": 0,
                }
            )
        )
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        runtime = int(
            subprocess.run(
                [sys.executable, "-c", RUNTIME],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
        )
        t0 = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        proc = subprocess.run(
            [sys.executable, "-m", "trainer", "run", str(spec), "--out", str(Path(tmp) / "out")],
            env=env,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"trainer failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        peak = usage.ru_maxrss * 1024
        assert peak >= before * 1024  # the trainer is the largest child so far
        size = data.stat().st_size
        print(
            json.dumps(
                {
                    "file_bytes": size,
                    "records": records,
                    "steps": args.steps,
                    "peak_rss_bytes": peak,
                    "runtime_rss_bytes": runtime,
                    "peak_minus_runtime_bytes": peak - runtime,
                    "peak_minus_runtime_per_file_byte": round((peak - runtime) / size, 2),
                    "seconds": round(seconds, 1),
                    "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),  # both children
                }
            )
        )


if __name__ == "__main__":
    main()
