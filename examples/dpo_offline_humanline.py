"""Journey (a): upload offline preference data and train offline+humanline DPO.

    export HUMANLINE_BASE_URL=http://127.0.0.1:8000 HUMANLINE_API_KEY=hl_...
    python examples/dpo_offline_humanline.py [--model smollm2-135m-instruct] [--steps 24]
                                             [--data FILE] [--download DIR] [--no-wait]

Uploads a JSONL preference file ({"prompt", "chosen", "rejected"} per line; the server
validates every line), submits a DPO job with humanline clipping (token log-ratios clamped
to [-1.5, 1.5]) and syncing (reference = policy before each update, k = 1), follows it with a
progress bar, then prints its last metrics and checkpoints and can download the trained
model (`--download DIR`: the exported adapter directory, loadable with peft).
With --no-wait (or HUMANLINE_NO_WAIT=1) it stops after submitting the job.

Needs only the SDK: pip install humanline-client (this repo: pip install ./client).
"""

from __future__ import annotations

import sys
from pathlib import Path

from journey import LORA_DPO, journey_options

from humanline_client import Client, HumanlineError

DATA = Path(__file__).resolve().parent / "data" / "preferences.jsonl"


def main(argv: list[str] | None = None) -> int:
    ap = journey_options(__doc__, steps=24)
    ap.add_argument("--data", type=Path, default=DATA, help="preference JSONL to upload")
    ap.add_argument("--download", type=Path, help="download the trained model into this directory")
    args = ap.parse_args(argv)

    with Client() as client:  # HUMANLINE_BASE_URL, HUMANLINE_API_KEY
        uploaded = client.files.upload(file=args.data, purpose="train")
        records = f"{uploaded.records} {uploaded.format} records"
        print(f"uploaded {args.data.name}: {uploaded.id} ({records})")

        job = client.jobs.create(
            base_model=args.model,
            training_file=uploaded.id,
            objective={"name": "dpo", "beta": 0.1},
            variant="offline+humanline",
            humanline_params={"log_eps_P": -1.5, "log_eps_R": 1.5, "sync_every": 1},
            max_steps=args.steps,
            checkpoint_every=max(1, args.steps // 2),
            metadata={"example": "dpo_offline_humanline"},
            **LORA_DPO,
        )
        print(f"created {job.id}: {job.objective} {job.variant} on {job.base_model}, {job.status}")
        if args.no_wait:
            print(f"not waiting; follow it with: humanline jobs events {job.id} --follow")
            return 0

        job = client.jobs.wait(job.id)  # a progress bar when stderr is a terminal
        print(f"{job.id} {job.status}")
        if job.status != "succeeded":
            print(f"error: {job.error}", file=sys.stderr)
            return 1

        metrics = list(client.jobs.metrics(job.id))
        if metrics:
            last = metrics[-1]
            shown = ", ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in sorted(last.values.items())
                if k != "time"  # a timestamp, not a training metric
            )
            print(f"step {last.step}: {shown}")
        checkpoints = list(client.jobs.checkpoints(job.id))
        for ckpt in checkpoints:
            print(f"checkpoint step {ckpt.step}: {ckpt.bytes} bytes, files {ckpt.files}")
        if args.download:
            # The exported model (adapter weights, adapter_config.json, model card), not a
            # training checkpoint: `PeftModel.from_pretrained(base, DIR)` loads it.
            client.jobs.download_model(job.id, args.download, progress=True)
            print(f"downloaded the model ({len(job.model_files)} files) to {args.download}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except HumanlineError as exc:
        sys.exit(f"error: {exc}")
