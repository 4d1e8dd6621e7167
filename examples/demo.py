"""`make demo`: the main job, end to end, on the embedded default.

Starts the API with SQLite, the local object store and the in-process worker (no external
service), then, through the Python SDK over real HTTP: uploads the bundled preference set,
trains offline and offline+humanline DPO on SmolLM2-135M-Instruct with LoRA, follows both
jobs, and prints where their checkpoints and metrics are.

    python examples/demo.py [--steps 24] [--keep]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEMO = REPO / ".humanline" / "demo"
DATA = REPO / "examples" / "data" / "preferences_small.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=24, help="optimizer steps per job")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument(
        "--keep", action="store_true", help="keep the previous demo's database and objects"
    )
    args = ap.parse_args()
    from api.embedded import EmbeddedService

    t0 = time.time()
    with EmbeddedService(DEMO, team="demo", fresh=not args.keep) as service:
        print(f"API on {service.base_url} (SQLite, local store, in-process worker under {DEMO})")
        return run(service.base_url, service.key, args.model, args.steps, t0)


def run(base_url: str, key: str, model: str, steps: int, t0: float) -> int:
    from humanline_client import Client

    client = Client(base_url=base_url, api_key=key)
    upload = client.files.upload(file=DATA, purpose="train")
    print(f"uploaded {DATA.name}: {upload.id}, {upload.records} {upload.format} records")

    common = dict(
        base_model=model,
        training_file=upload.id,
        objective={"name": "dpo", "beta": 0.1},
        adapter={"kind": "lora", "r": 8, "alpha": 16},
        batch_size=4,
        max_steps=steps,
        checkpoint_every=max(1, steps // 3),
        max_length=160,
        max_prompt_length=96,
        optim={"lr": 2e-4},
        quality_sample=32,
    )
    jobs = {
        v: client.jobs.create(variant=v, metadata={"demo": "1"}, **common)
        for v in ("offline", "offline+humanline")
    }
    for variant, job in jobs.items():
        print(f"\n{variant}: job {job.id}")
        done = client.jobs.wait(job.id, progress=True, timeout=1800)
        print(f"  status: {done.status}" + (f" ({done.error})" if done.error else ""))
        if done.status != "succeeded":
            return 1

    print(f"\n{'variant':<20}{'loss':>8}{'margin':>9}{'clamped':>9}  checkpoints")
    for variant, job in jobs.items():
        last = list(client.jobs.metrics(job.id))[-1].values
        steps = [c.step for c in client.jobs.checkpoints(job.id)]
        print(
            f"{variant:<20}{last['loss']:>8.4f}{last.get('rewards/margins', 0):>9.4f}"
            f"{last.get('clamp_frac', 0):>9.3f}  steps {steps}"
        )
    print(
        "(humanline scores each step against the policy of the step before, so its loss stays\n"
        " near log 2 and its margin near 0 by design; compare variants by evaluation, not loss)"
    )
    ids = [job.id for job in jobs.values()]
    page = client.reports.compare(jobs=ids, format="html", to=DEMO / "compare.html")
    print(
        f"\nComparison report (curves overlaid, cost, spec differences; evaluate the jobs with\n"
        f"  `humanline evals create` to compare quality): {page}"
    )
    print(f"Objects (checkpoints, final models): {DEMO / 'objects'}")
    print(f"Run directories (metrics.jsonl, events.jsonl, data_quality.json): {DEMO / 'work'}")
    print(f"Database: {DEMO / 'humanline.db'}   wall-clock: {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
