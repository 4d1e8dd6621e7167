"""Journey (c): online humanline GRPO on verifiable math, then a math evaluation.

    export HUMANLINE_BASE_URL=http://127.0.0.1:8000 HUMANLINE_API_KEY=hl_...
    python examples/online_grpo_math.py [--model smollm2-135m-instruct] [--steps 16]
                                        [--sample-every 8] [--no-wait]

Uploads prompts with verifiable answers ({"prompt", "answer"} per line), submits an
online+humanline GRPO job: every `--sample-every` steps the policy samples 4 completions per
prompt, the paper's math rewards score them (tag_count 1, format 1, math-verify accuracy 8),
and GRPO trains on the groups with humanline clipping and syncing. The job also names an
evaluation (MATH500 layout, pass@1) to run on its final model. Prints the reward curve.
With --no-wait (or HUMANLINE_NO_WAIT=1) it stops after submitting the job.

Needs only the SDK: pip install humanline-client (this repo: pip install ./client).
"""

from __future__ import annotations

import sys
from pathlib import Path

from journey import journey_options

from humanline_client import Client, HumanlineError

DATA = Path(__file__).resolve().parent / "data"


def main(argv: list[str] | None = None) -> int:
    ap = journey_options(__doc__, steps=16)
    ap.add_argument("--sample-every", type=int, default=8, help="steps per sampling round")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument(
        "--lag",
        type=int,
        default=0,
        help="sample asynchronously, this many steps behind the trainer (0: sync)",
    )
    args = ap.parse_args(argv)

    with Client() as client:  # HUMANLINE_BASE_URL, HUMANLINE_API_KEY
        prompts = client.files.upload(file=DATA / "arithmetic_train.jsonl", purpose="train")
        evals = client.files.upload(file=DATA / "arithmetic_eval.jsonl", purpose="eval")
        print(f"uploaded {prompts.records} {prompts.format} prompts", end=" ")
        print(f"and {evals.records} {evals.format} problems")
        job = client.jobs.create(
            base_model=args.model,
            training_file=prompts.id,
            objective="grpo",
            variant="online+humanline",
            humanline_params={"sync_every": 4},
            adapter={"kind": "lora", "r": 8, "alpha": 16},
            batch_size=8,  # sequences: 2 groups of 4
            max_steps=args.steps,
            max_length=448,
            max_prompt_length=400,
            optim={"lr": 1e-4},
            metadata={"example": "online_grpo_math"},
            online={
                "num_samples": 4,
                "max_new_tokens": args.max_new_tokens,
                "sample_every": args.sample_every,
                "tau": 0.0,
                **({"mode": "async", "lag": args.lag} if args.lag else {}),
            },
            evaluations=[  # run on the final model when the job succeeds
                {
                    "file_id": evals.id,
                    "kind": "math",
                    "max_items": 8,
                    "generation": {"n": 1, "max_new_tokens": args.max_new_tokens},
                }
            ],
        )
        print(
            f"job {job.id}: online+humanline GRPO, a sampling round every {args.sample_every} steps"
        )
        if args.no_wait:
            print("not waiting (--no-wait)")
            return 0
        try:
            done = client.jobs.wait(job.id, timeout=3600)
        except HumanlineError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"status: {done.status}")
        for m in client.jobs.metrics(done.id):
            if "reward/mean" in m.values:
                parts = {k[7:]: round(v, 3) for k, v in m.values.items() if k.startswith("reward/")}
                print(f"round at step {m.step}: {parts}")
            if "async/lag" in m.values:  # which policy version sampled it, and the waits
                v = m.values
                print(
                    f"  sampled by version {int(v['async/version'])} (lag "
                    f"{int(v['async/lag'])}), trainer waited {v['async/wait_time']:.2f} s"
                )
        return 0 if done.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
