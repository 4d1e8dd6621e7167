"""The demo's second part: what asynchronous online training is for, on the testbed's task.

The controlled testbed (benchmarks/testbed.py, docs/replication.md): sums like ``417+6=``, a
small Llama with a digit-per-token tokenizer and an SFT base made by a product job. Then two
online GRPO jobs through the same service, same seed, steps and prompts:

- **sync online**: each step samples from the current policy, then trains (the trainer's
  process does both in turn, on both cores);
- **async + humanline at lag L**: a sampler process samples step t's batch from the policy of
  step max(1, t − L) while the trainer trains (one core each), and humanline makes the stale
  samples safe to learn from (contract/online_async.py, docs/async.md).

Both final models are evaluated on held-out sums by the evaluations API (greedy pass@1), and
the verdict line gives the accuracy before and after and each run's wall-clock.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

LAG = 4  # async: samples up to 4 steps stale (humanline's tolerance; 1 is enough to overlap)
STEPS = 96


@dataclass(frozen=True)
class Arm:
    name: str
    seconds: float
    accuracy: float


def async_part(client: Any, root: Path) -> str | None:
    """Build the base, train both arms, evaluate; the verdict line (None on a failure)."""
    import testbed as tb
    import testbed_env as tenv
    from replicate import pass_at_1

    setup = replace(tb.Setup(), steps=STEPS, eval_size=100, seeds=[0], lags=(LAG,))
    print(
        f"\nOnline GRPO on the testbed's sums ({setup.digits[0]}-digit + {setup.digits[1]}-digit):"
        " an SFT base first (a product job), then sync online vs async + humanline"
    )
    root.mkdir(parents=True, exist_ok=True)
    # the testbed's recipe: the base built with pinned kernels and one thread (the base is
    # sensitive to both: docs/replication.md), the GRPO jobs with two threads
    os.environ.update(tenv.PIN_ENV)  # inherited by the jobs the in-process worker starts
    base, ids, before = tb.build(setup, root, client)
    os.environ.update(tenv.ARM_ENV)
    request = tb.eval_request(setup, ids["heldout"])
    arms = []
    for name, arm in (
        ("sync online", "online"),
        (f"async+humanline lag {LAG}", f"async-{LAG}+humanline"),
    ):
        spec = tb.grpo_spec(setup, arm, 0, base, ids["grpo"])  # the testbed's own arms
        spec["metadata"] = {"demo": "async", "arm": name}
        job = client.jobs.create(**spec)
        done = client.jobs.wait(job.id, timeout=1800)
        print(f"  {name}: job {job.id} {done.status}" + (f" ({done.error})" if done.error else ""))
        if done.status != "succeeded" or not (done.started_at and done.finished_at):
            return None
        ev = client.evaluations.create(job_id=job.id, **request)
        accuracy = pass_at_1(client.evaluations.wait(ev.id, timeout=1800))
        seconds = (done.finished_at - done.started_at).total_seconds()
        arms.append(Arm(name, seconds, accuracy))
        print(f"    held-out accuracy {accuracy:.1%}, wall-clock {seconds:.0f} s")
    sync, lagged = arms
    return (
        f"online GRPO, {setup.eval_size} held-out sums: base {before:.1%} → {sync.name} "
        f"{sync.accuracy:.1%} in {sync.seconds:.0f} s, {lagged.name} {lagged.accuracy:.1%} in "
        f"{lagged.seconds:.0f} s ({lagged.seconds / sync.seconds:.2f}× the wall-clock)"
    )
