"""`make demo`: the main job, end to end, on the embedded default.

Starts the API with SQLite, the local object store and the in-process worker (no external
service), then, through the Python SDK over real HTTP: uploads the bundled preference set,
trains offline and offline+humanline DPO on SmolLM2-135M-Instruct with LoRA, follows both
jobs, then evaluates both final models on the bundled instruction set (held-out prompts, the
base model's answers as references; trainer/evaluation/demo_set.py) with a local reward model
fitted to the same preference pairs (trainer/evaluation/probe_rm.py), and prints one verdict
line with its uncertainty (reports/verdict.py) and the comparison report's path.

    python examples/demo.py [--steps 16] [--eval-items 32] [--keep]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))
DEMO = REPO / ".humanline" / "demo"
DATA = REPO / "examples" / "data" / "preferences_small.jsonl"
EVAL_DATA = REPO / "examples" / "data" / "instruction_eval_demo.jsonl"
JUDGE = "demo-rm"  # the operator's name for the judge (EVAL_REWARD_MODELS); users never see paths
JUDGE_BASE = "tiny-llama"  # its features: random, so it learns the data's form, not facts


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=16, help="optimizer steps per job")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--eval-items", type=int, default=32, help="items of the eval set to use")
    ap.add_argument(
        "--keep", action="store_true", help="keep the previous demo's database and objects"
    )
    args = ap.parse_args()
    from api.embedded import EmbeddedService

    t0 = time.time()
    judge_dir = DEMO / "judge"
    testbed = DEMO / "testbed"  # the online part's task and models (examples/demo_async.py)
    env = {
        "EVAL_REWARD_MODELS": f"{JUDGE}={judge_dir}",
        # the operator mounts the testbed's model directories (users never name a path)
        "ALLOWED_BASE_MODELS": f"{args.model},{JUDGE_BASE},{testbed / 'init'},{testbed / 'base'}",
        "EVAL_WARM_START": "1",  # five small evaluations: forked warm, not started cold each
    }
    service = EmbeddedService(DEMO, team="demo", fresh=not args.keep, env=env)
    fit_judge(judge_dir)
    with service:
        print(f"API on {service.base_url} (SQLite, local store, in-process worker under {DEMO})")
        return run(service.base_url, service.key, args.model, args.steps, args.eval_items, t0)


def fit_judge(out: Path) -> None:
    """The operator's side: a reward model for the judge, fitted to the demo's preference pairs
    in a second (an instruction evaluation needs a judge, and none is reachable offline)."""
    import json

    from trainer.evaluation.probe_rm import fit_probe_reward_model

    pairs = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    fit_probe_reward_model(JUDGE_BASE, pairs, out)


def run(base_url: str, key: str, model: str, steps: int, eval_items: int, t0: float) -> int:
    from humanline_client import Client

    with Client(base_url=base_url, api_key=key) as client:
        return session(client, model, steps, eval_items, t0)


def session(client, model: str, steps: int, eval_items: int, t0: float) -> int:
    """What a user does, through the SDK: upload, train both variants, evaluate, compare."""
    upload = client.files.upload(file=DATA, purpose="train")
    print(f"uploaded {DATA.name}: {upload.id}, {upload.records} {upload.format} records")

    common = dict(
        base_model=model,
        training_file=upload.id,
        objective={"name": "dpo", "beta": 0.1},
        adapter={"kind": "lora", "r": 8, "alpha": 16},
        batch_size=4,
        max_steps=steps,
        checkpoint_every=max(1, steps // 2),
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
    verdict = evaluate(client, jobs, eval_items)
    if verdict is None:
        return 1
    from demo_async import async_part  # examples/: online GRPO, sync vs async + humanline

    online = async_part(client, DEMO / "testbed")  # the directory the service allows
    if online is None:
        return 1
    print(f"Objects (checkpoints, final models): {DEMO / 'objects'}")
    print(f"Run directories (metrics.jsonl, events.jsonl, data_quality.json): {DEMO / 'work'}")
    print(f"Database: {DEMO / 'humanline.db'}   wall-clock: {time.time() - t0:.0f} s")
    print(f"\nVerdict: {verdict.line()}")
    print(f"Verdict: {online}")
    return 0


def evaluate(client, jobs: dict, eval_items: int):
    """Evaluate each job's final model through the evaluations API, write the comparison
    report, and return the paired verdict (offline+humanline vs offline); None on a failure."""
    from reports.verdict import judgements_from_items, paired_verdict
    from trainer.evaluation.demo_set import MAX_NEW_TOKENS

    eval_file = client.files.upload(file=EVAL_DATA, purpose="eval")
    n = min(eval_items, eval_file.records)
    print(
        f"\nEvaluating both final models on {n} held-out instructions ({EVAL_DATA.name}); the\n"
        f"  reference answers are the base model's, the judge a reward model fitted to the\n"
        f"  training pairs ({JUDGE_BASE} features: it rewards the chosen answers' form, not facts)"
    )
    evals = {
        variant: client.evaluations.create(
            job_id=job.id,
            file_id=eval_file.id,
            kind="instruction",
            judge={"type": "reward_model", "model": JUDGE},
            generation={"max_new_tokens": MAX_NEW_TOKENS},
            max_items=n,
        )
        for variant, job in jobs.items()
    }
    judgements, answers = {}, {}
    for variant, ev in evals.items():
        done = client.evaluations.wait(ev.id, timeout=1800, poll_interval=1.0)
        failure = f" ({(done.error or {}).get('message')})" if done.error else ""
        print(f"  {variant}: evaluation {ev.id} {done.status}{failure}")
        if done.status != "succeeded":
            return None
        items = client.evaluations.report(ev.id).items
        _, judgements[variant] = judgements_from_items(items)
        answers[variant] = {it["index"]: it.get("output") for it in items}
    differ = sum(
        answers["offline"][i] != answers["offline+humanline"].get(i) for i in answers["offline"]
    )
    print(f"  the two models' answers differ on {differ} of {len(answers['offline'])} instructions")
    page = client.reports.compare(
        jobs=[job.id for job in jobs.values()], format="html", metric="win_rate",
        file_id=eval_file.id, to=DEMO / "compare.html",
    )  # fmt: skip
    print(f"\nComparison report (win rates, curves overlaid, cost, spec differences): {page}")
    return paired_verdict(
        judgements["offline+humanline"], judgements["offline"], a="offline+humanline", b="offline"
    )


if __name__ == "__main__":
    sys.exit(main())
