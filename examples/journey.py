"""What the example journeys share (each needs only the SDK; this folder is on sys.path when
one of them runs as a script).

    journey_options(doc, steps)  an argument parser with --model, --steps and --no-wait (also
                                 HUMANLINE_NO_WAIT=1: stop after submitting)
    LORA_DPO                     the job settings of the DPO journeys: a rank-8 LoRA, 4 pairs a
                                 step, sequences the bundled preferences fit in
"""

from __future__ import annotations

import argparse
import os
from typing import Any

LORA_DPO: dict[str, Any] = {
    "adapter": {"kind": "lora", "r": 8, "alpha": 16},
    "optim": {"lr": 2e-4},
    "batch_size": 4,
    "max_length": 160,
    "max_prompt_length": 96,
}


def journey_options(doc: str | None, steps: int) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="base model")
    ap.add_argument("--steps", type=int, default=steps, help="optimizer steps")
    ap.add_argument(
        "--no-wait",
        action="store_true",
        default=os.environ.get("HUMANLINE_NO_WAIT", "") not in ("", "0"),
        help="stop after submitting (also HUMANLINE_NO_WAIT=1)",
    )
    return ap
