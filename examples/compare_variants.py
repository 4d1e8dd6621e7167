"""Journey (b): offline vs offline+humanline DPO on the same data, final metrics side by side.

    export HUMANLINE_BASE_URL=http://127.0.0.1:8000 HUMANLINE_API_KEY=hl_...
    python examples/compare_variants.py [--model smollm2-135m-instruct] [--steps 24]
                                        [--data FILE | --file-id file-...] [--no-wait]
                                        [--reports DIR]

Both jobs get the same spec and seed; only the variant differs, so the difference in their
metrics is humanline's (clipped token log-ratios, reference synced every step). Both are
tagged with metadata {"comparison": TAG}, so `humanline jobs list --metadata comparison=TAG`
finds them again. With --no-wait (or HUMANLINE_NO_WAIT=1) it stops after submitting.
--reports DIR saves each job's HTML report (training curves, data quality, manifest) there.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from journey import LORA_DPO, journey_options

from humanline_client import Client, HumanlineError, Job

DATA = Path(__file__).resolve().parent / "data" / "preferences.jsonl"
VARIANTS = ("offline", "offline+humanline")


def fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def side_by_side(rows: list[tuple[str, list[str]]], headers: list[str]) -> str:
    width = max(len(name) for name, _ in rows + [("metric", [])])
    cols = [max(len(h), *(len(vals[i]) for _, vals in rows)) for i, h in enumerate(headers)]
    lines = [
        "  ".join(
            ["metric".ljust(width), *(h.rjust(w) for h, w in zip(headers, cols, strict=True))]
        )
    ]
    for name, values in rows:
        lines.append(
            "  ".join([name.ljust(width), *(v.rjust(w) for v, w in zip(values, cols, strict=True))])
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = journey_options(__doc__, steps=24)
    ap.add_argument("--data", type=Path, default=DATA, help="preference JSONL to upload")
    ap.add_argument("--file-id", help="an already uploaded training file instead of --data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default=f"cmp-{int(time.time())}", help="metadata comparison=TAG")
    ap.add_argument("--reports", type=Path, help="save each job's HTML report in this directory")
    args = ap.parse_args(argv)

    with Client() as client:
        file_id = args.file_id
        if file_id is None:
            file_id = client.files.upload(file=args.data, purpose="train").id
            print(f"uploaded {args.data.name}: {file_id}")

        jobs: dict[str, Job] = {}
        for variant in VARIANTS:
            jobs[variant] = client.jobs.create(
                base_model=args.model,
                training_file=file_id,
                objective="dpo",
                variant=variant,  # the only difference between the two jobs
                max_steps=args.steps,
                seed=args.seed,
                metadata={"comparison": args.tag, "variant": variant},
                **LORA_DPO,
            )
            print(f"{variant:>18}: {jobs[variant].id}")
        if args.no_wait:
            print(
                f"not waiting; list them with: humanline jobs list --metadata comparison={args.tag}"
            )
            return 0

        for variant, job in jobs.items():  # they train concurrently when workers allow
            jobs[variant] = client.jobs.wait(job.id)
            print(f"{variant:>18}: {jobs[variant].status}")

        finals = {}
        for variant, job in jobs.items():
            metrics = list(client.jobs.metrics(job.id))
            finals[variant] = metrics[-1].values if metrics else {}
        names = sorted({name for values in finals.values() for name in values} - {"time"})
        rows = [("status", [jobs[v].status for v in VARIANTS])]
        rows.append(("steps", [str(jobs[v].current_step) for v in VARIANTS]))
        rows += [(name, [fmt(finals[v].get(name)) for v in VARIANTS]) for name in names]
        print()
        print(side_by_side(rows, list(VARIANTS)))

        if args.reports is not None:
            args.reports.mkdir(parents=True, exist_ok=True)
            print()
            for variant, job in jobs.items():
                page = client.jobs.report(
                    job.id, format="html", to=args.reports / f"{variant}.html"
                )
                print(f"{variant:>18}: report {page}")
            ids = " ".join(job.id for job in jobs.values())
            print("evaluate both (humanline evals create --job ID ...), then compare them with:")
            print(f"  humanline reports compare {ids} --html comparison.html")
        return 0 if all(j.status == "succeeded" for j in jobs.values()) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except HumanlineError as exc:
        sys.exit(f"error: {exc}")
