"""Issue 28: a testbed chosen by the question, where online GRPO learns in CPU minutes and
stale sampling has a gap for humanline to close. Everything runs through the product's job
path (api.embedded: API, in-process worker, job specs, evaluations, comparison report).

Task: two-operand addition ``a+b=`` (operands drawn by a fixed RNG; train and held-out
disjoint), the answer a number the product's ``math_accuracy`` verifier checks. Model: a small
random-init Llama with a task tokenizer (every digit one token, `task_tokenizer`); its base
policy is a product ``objective: sft`` job on worked sums (held-out accuracy roughly 20-50%).

Arms (docs/replication.md, pre-registered rules): online (``sample_every: 1``), stale-S
(``sample_every: S``, S × the data every S steps: same total), stale-S+humanline (k from the
``math`` preset, 12), optionally a k sweep at the largest S. The defaults are the confirmatory
study (issue 35): online, stale-32, stale-32+humanline; seeds 10-25; the final checkpoint only;
a 45-minute time box; the pinned base (testbed_env). `--lags L …` adds async arms (a sampler
process beside the trainer, L steps behind: async-L, async-L+humanline). Studies 1-2 were
``--stales 8 32 --k-sweep 4 24 --seeds 0 1 2 3 4 --eval-points 4 --deadline 0 --unpinned``.

    python benchmarks/testbed.py build     # task files, random model, SFT base checkpoint
    python benchmarks/testbed.py           # build + the confirmatory study
    python benchmarks/testbed.py --quick   # the path in < 2 min (make test); figures mean nothing
    python benchmarks/testbed.py report    # figures, report and picture again from --out's DB

The last line is one JSON object: every figure with its criterion.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "client"))
sys.path.insert(0, str(REPO / "benchmarks"))

import testbed_env as tenv  # noqa: E402
import testbed_figures as tf  # noqa: E402
from testbed_task import make_model, make_task, task_tokenizer  # noqa: E402, F401

MATH_PRESET_K = 12  # contract/presets.py: the math preset's humanline_params.sync_every


@dataclass
class Setup:
    # task
    digits: tuple[int, int] = (3, 1)  # digits of the first and the second operand
    train_size: int = 2000
    eval_size: int = 200
    # model: random Llama over the task tokenizer (vocab 278)
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    # base policy (product SFT job)
    sft_steps: int = 350
    sft_batch: int = 32
    sft_lr: float = 3e-3
    # GRPO (tuned on the online arm only, then frozen)
    steps: int = 128
    prompts_per_step: int = 8
    group: int = 8
    lr: float = 2e-4
    max_new_tokens: int = 6
    stales: tuple[int, ...] = (32,)
    lags: tuple[int, ...] = ()  # `--lags`: async arms (online.mode async at lag L, ± humanline)
    k_sweep: tuple[int, ...] = ()
    seeds: list[int] = field(default_factory=lambda: list(range(10, 26)))
    eval_points: int = 1  # checkpoints evaluated along the way (the final one included)
    eval_samples: int = 1
    arm_names: tuple[str, ...] | None = None  # `--arms`: a subset of arms() (None: all)
    deadline_min: float | None = 45.0  # `--deadline`: the time box from the start (0: none)


def quick_setup() -> Setup:
    return Setup(
        train_size=64, eval_size=8, hidden=32, layers=1, heads=2, sft_steps=2, sft_batch=8,
        steps=2, prompts_per_step=2, group=2, stales=(2,), k_sweep=(), seeds=[0],
        eval_points=1,
    )  # fmt: skip


# ---- specs ----------------------------------------------------------------------------------
def arms(setup: Setup) -> dict[str, tuple[int, int | None]]:
    """name → (sample_every, humanline k or None)."""
    out: dict[str, tuple[int, int | None]] = {"online": (1, None)}
    for s in setup.stales:
        out[f"stale-{s}"] = (s, None)
        out[f"stale-{s}+humanline"] = (s, MATH_PRESET_K)
    for k in setup.k_sweep:
        out[f"stale-{max(setup.stales)}+humanline-k{k}"] = (max(setup.stales), k)
    for lag in setup.lags:  # the paper's question in its product form: quality held at lag L?
        out[f"async-{lag}"] = (1, None)
        out[f"async-{lag}+humanline"] = (1, MATH_PRESET_K)
    if setup.arm_names is not None:
        if unknown := set(setup.arm_names) - set(out):
            raise SystemExit(f"--arms: unknown {sorted(unknown)}; known {sorted(out)}")
        out = {a: v for a, v in out.items() if a in setup.arm_names}
    return out


def lag_of(arm: str) -> int | None:
    """An async arm's lag (`async-L`, `async-L+humanline`), else None."""
    return int(arm.split("-")[1].split("+")[0]) if arm.startswith("async-") else None


def sft_spec(setup: Setup, model: Path, file_id: str) -> dict[str, Any]:
    return {"base_model": str(model), "training_file": file_id, "objective": {"name": "sft"},
            "batch_size": setup.sft_batch, "max_steps": setup.sft_steps, "max_length": 32,
            "max_prompt_length": 24,
            "seed": 0, "optim": {"lr": setup.sft_lr, "warmup_ratio": 0.0},
            "quality_sample": 0, "metadata": {"testbed": "base"}}  # fmt: skip


def grpo_spec(setup: Setup, arm: str, seed: int, base: Path, file_id: str) -> dict[str, Any]:
    every, k = arms(setup)[arm]
    lag = lag_of(arm)
    spec: dict[str, Any] = {
        "base_model": str(base),
        "training_file": file_id,
        "objective": {"name": "grpo"},
        "data_source": "online",
        "humanline": k is not None,
        "humanline_params": {"sync_every": k or MATH_PRESET_K},
        "batch_size": setup.prompts_per_step * setup.group,
        "max_steps": setup.steps,
        "max_length": 32,
        "max_prompt_length": 24,
        "seed": seed,
        "optim": {"lr": setup.lr, "warmup_ratio": 0.0},
        "checkpoint_every": max(1, setup.steps // setup.eval_points),
        "quality_sample": 0,
        "metadata": {"arm": arm, "testbed": "1"},
        "online": {"engine": "hf", "num_samples": setup.group,
                   "max_new_tokens": setup.max_new_tokens, "sample_every": every,
                   "rewards": [{"name": "math_accuracy", "weight": 1.0}],
                   "zero_variance_groups": "keep"},
    }  # fmt: skip
    if lag is not None:  # a sampler process beside the trainer, `lag` steps behind
        spec["online"] |= {"mode": "async", "lag": lag}
    return spec


def eval_request(setup: Setup, eval_id: str) -> dict[str, Any]:
    return {"file_id": eval_id, "kind": "math", "prompt_template": "{problem}",
            "generation": {"n": setup.eval_samples, "temperature": 0.0,
                           "max_new_tokens": setup.max_new_tokens, "seed": 0}}  # fmt: skip


# ---- the run -------------------------------------------------------------------------------
def build(
    setup: Setup, root: Path, client: Any, reuse: Path | None = None
) -> tuple[Path, dict[str, str], float]:
    """Task files uploaded, random model, SFT base checkpoint downloaded (or `reuse`, a base
    an earlier build made: copied, not retrained); base accuracy."""
    import shutil

    from replicate import pass_at_1

    paths = make_task(setup, root)
    ids = {k: client.files.upload(file=p, purpose="train" if k != "heldout" else "eval").id
           for k, p in paths.items()}  # fmt: skip
    if reuse is not None:
        base = Path(shutil.copytree(reuse, root / "base"))
    else:
        init = make_model(setup, root / "init")
        job = client.jobs.wait(client.jobs.create(**sft_spec(setup, init, ids["sft"])).id,
                               timeout=3600)  # fmt: skip
        if job.status != "succeeded":
            raise RuntimeError(f"base SFT job {job.id} {job.status}: {job.error}")
        base = client.jobs.download_model(job.id, root / "base")
    ev = client.evaluations.create(base_model=str(base), **eval_request(setup, ids["heldout"]))
    acc = pass_at_1(client.evaluations.wait(ev.id, timeout=3600))
    print(f"base: {base} held-out accuracy {acc:.3f}", flush=True)
    return Path(base), ids, acc


def _evaluation(client: Any, job_id: str, step: int | None, request: dict, wait=3600.0) -> Any:
    """The job's evaluation of `step` (None: the final model) on the held-out file: an
    existing one (a rerun or `report` reuses it), else a new one; waited for."""
    for ev in client.evaluations.list(job_id=job_id, limit=100):
        if ev.step == step and ev.file_id == request["file_id"] and ev.status != "failed":
            return client.evaluations.wait(ev.id, timeout=wait)
    ev = client.evaluations.create(job_id=job_id, step=step, **request)
    return client.evaluations.wait(ev.id, timeout=wait)


def follow(
    client: Any, job_id: str, seed: int, setup: Setup, request: dict, timeout: float = 7200
) -> dict[str, Any]:
    """One job's figures, all read back from the service: held-out accuracy at each
    checkpoint and at the end, completions sampled by each of those steps (Σ round/prompts ×
    group, as the comparison report counts them), wall-clock, clamp fraction and KL."""
    from replicate import pass_at_1

    from reports.groups import sampled_at, sampled_by_step

    timeout = max(timeout, 1.0)
    job = client.jobs.wait(job_id, timeout=timeout)
    if job.status != "succeeded":
        raise RuntimeError(f"job {job_id} {job.status}: {job.error}")
    metrics = [m.values | {"step": m.step} for m in client.jobs.metrics(job_id)]
    steps = [c.step for c in client.jobs.checkpoints(job_id) if c.step < setup.steps]
    curve = {s: pass_at_1(_evaluation(client, job_id, s, request, timeout)) for s in steps}
    curve[setup.steps] = pass_at_1(_evaluation(client, job_id, None, request, timeout))
    rounds = sampled_by_step({"spec": job.spec, "metrics": metrics})
    sampled = {s: sampled_at(rounds, s) for s in curve}
    sample_s = sum(m.get("round/sample_time", 0.0) for m in metrics)
    wall = (job.finished_at - job.started_at).total_seconds()
    return {
        "seed": seed, "job": job_id, "accuracy": curve[setup.steps], "curve": curve,
        "samples_drawn": sampled[setup.steps], "samples_curve": sampled, "rounds": len(rounds),
        "sampling_s": sample_s, "training_s": wall - sample_s, "wall_clock_s": wall,
        "clamp_frac_max": max((m.get("clamp_frac", 0.0) for m in metrics), default=0.0),
        "clamp_frac_mean": tf.mean([m.get("clamp_frac", 0.0) for m in metrics]),
        "kl_max": max((m.get("kl", 0.0) for m in metrics), default=0.0),
        "kl_mean": tf.mean([m.get("kl", 0.0) for m in metrics]),
        **tf.mechanism(metrics, job.spec),
    }  # fmt: skip


def submit(
    setup: Setup, client: Any, base: Path, ids: dict[str, str], only: str | None, seed: int
) -> dict[tuple[str, int], str]:
    """One seed's arms, queued; (arm, seed) → job id."""
    request = eval_request(setup, ids["heldout"])
    out = {}
    for arm in arms(setup):
        if only in (None, arm):
            spec = grpo_spec(setup, arm, seed, base, ids["grpo"])
            out[arm, seed] = client.jobs.create(**spec, evaluations=[request]).id
    return out


def collect(
    setup: Setup,
    root: Path,
    client: Any,
    only: str | None = None,
    deadline: float | None = None,
    queue: Any = None,
) -> tuple[dict[str, list[dict]], float, list[int]]:
    """The study's jobs (metadata testbed=1, one per arm × seed) followed to their figures,
    seed by seed; with a `deadline` (epoch seconds) a seed whose arms are not all complete by
    then is dropped whole (returned last); the service's comparison report, grouped by arm, in
    root/compare.html; the base's held-out accuracy (its evaluation, reused). `queue(seed)`
    (a study, not `report`) submits a seed: the next one as soon as this one's jobs end, so the
    one-at-a-time worker runs each seed's evaluations before the next seed's jobs (all queued
    at once, every evaluation would wait behind every job and miss the deadline)."""
    from replicate import pass_at_1

    heldout = next(f for f in client.files.list(purpose="eval", limit=100)
                   if f.filename == "addition_heldout.jsonl")  # fmt: skip
    request = eval_request(setup, heldout.id)
    found: dict[tuple[str, int], str] = {}
    for job in client.jobs.list(metadata={"testbed": "1"}, limit=100):
        found.setdefault((job.metadata["arm"], job.spec["seed"]), job.id)
    results: dict[str, list[dict]] = {a: [] for a in arms(setup) if only in (None, a)}
    dropped: list[int] = []

    def left() -> float:
        return 7200.0 if deadline is None else deadline - time.time()

    if queue is not None and setup.seeds:
        found.update(queue(setup.seeds[0]))
    for i, seed in enumerate(setup.seeds):
        try:  # a seed counts only with every arm complete (paired analysis)
            if any((a, seed) not in found for a in results):
                raise TimeoutError(f"seed {seed} was not queued before the deadline")
            if queue is not None and i + 1 < len(setup.seeds):
                for a in results:
                    client.jobs.wait(found[a, seed], timeout=max(left(), 1.0))
                if left() > 0:
                    found.update(queue(setup.seeds[i + 1]))
            runs = {
                a: follow(client, found[a, seed], seed, setup, request, left()) for a in results
            }
        except TimeoutError:
            dropped.append(seed)
            print(f"seed {seed}: not complete by the deadline, left out", flush=True)
            continue
        for arm, one in runs.items():
            results[arm].append(one)
            print(f"{arm} seed {seed}: {json.dumps(one)}", flush=True)
    client.reports.compare(
        jobs=[r["job"] for runs in results.values() for r in runs], format="html",
        metric="pass_at_1", file_id=heldout.id, group_by="arm", to=root / "compare.html",
    )  # fmt: skip
    base = next(e for e in client.evaluations.list(limit=100)
                if e.job_id is None and Path(e.base_model or "").name == "base"
                and e.file_id == heldout.id and e.status == "succeeded")  # fmt: skip
    return results, pass_at_1(base), dropped


def run(
    setup: Setup,
    root: Path,
    command: str,
    reuse: Path | None = None,
    only: str | None = None,
    unpinned: bool = False,
) -> dict[str, Any]:
    """`build`: task, model, base. `study`: build, submit, collect. `report`: collect again
    from a study's root (its service's DB: finished jobs and evaluations are reused). The base
    must be the pinned one (testbed_env.BASE_SHA256) unless `unpinned`."""
    from api.embedded import EmbeddedService

    t0 = time.time()
    env = {
        "EVAL_SAMPLING_ENGINE": "hf",
        "TOKENIZERS_PARALLELISM": "false",
        # the operator mounts the testbed's model directories (users never name a path)
        "ALLOWED_BASE_MODELS": f"tiny-llama,{root / 'init'},{root / 'base'}",
        # the whole study is queued at once (7 arms × 5 seeds, a final evaluation each; the
        # default quotas are 10 active jobs and 10 active evaluations per team)
        "MAX_JOBS_PER_TEAM": "64",
        "MAX_EVALS_PER_TEAM": "64",
        # 141 small evaluations: forked from a warm process, not a fresh interpreter each
        # (worker.warm: ~6 s of imports less each, the same results)
        "EVAL_WARM_START": "1",
        "CAP_ONLINE_LAG": "16",  # async arms may ask more than the default cap of 4
        **tenv.PIN_ENV,  # one base everywhere: the same kernels and threads on every CPU
    }
    deadline = t0 + 60 * setup.deadline_min if setup.deadline_min else None
    with EmbeddedService(root, team="testbed", fresh=command != "report", env=env) as service:
        from humanline_client import Client

        client = Client(base_url=service.base_url, api_key=service.key, timeout=120)
        if command != "report":
            base, ids, base_acc = build(setup, root, client, reuse)
            digest = tenv.check_base(base, unpinned=unpinned)
            if command == "build":
                return {
                    "base": str(base),
                    "base_accuracy": base_acc,
                    "base_sha256": digest,
                    "build_s": time.time() - t0,
                    "fingerprint": tenv.fingerprint(base, unpinned=unpinned),
                }
            os.environ.update(tenv.ARM_ENV)  # the jobs started from now on: two threads
        tenv.check_base(root / "base", unpinned=unpinned)
        queue = None if command == "report" else (
            lambda seed: submit(setup, client, base, ids, only, seed))  # fmt: skip
        results, base_acc, dropped = collect(setup, root, client, only, deadline, queue)
    fingerprint = tenv.fingerprint(root / "base", unpinned=unpinned)
    if only is not None:  # a tuning run (online arm only): its curve, no comparison
        return {"setup": asdict(setup), "base_accuracy": base_acc, "arms": results,
                "fingerprint": fingerprint}  # fmt: skip
    summary = tf.figures(asdict(setup), results, base_acc, MATH_PRESET_K)
    summary["fingerprint"] = fingerprint
    summary["seeds_left_out"] = dropped  # --deadline: seeds with an arm not complete in time
    summary["wall_clock_total_s"] = time.time() - t0
    summary["report"] = str(root / "compare.html")
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", nargs="?", choices=["build", "study", "report"], default="study")
    ap.add_argument("--quick", action="store_true", help="the path only, in < 2 minutes")
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--out", type=Path, default=REPO / ".humanline" / "testbed")
    ap.add_argument("--base", type=Path, help="reuse the base model an earlier build made")
    ap.add_argument("--only", help="one arm (tuning: online only, rule 1)")
    ap.add_argument("--prompts-per-step", type=int)
    ap.add_argument("--eval-points", type=int, help="checkpoints evaluated along the way")
    ap.add_argument("--sft-steps", type=int, help="the base policy's SFT steps")
    ap.add_argument("--sft-lr", type=float)
    ap.add_argument("--png", type=Path, help="the figure (default: docs/testbed.png, full)")
    ap.add_argument("--arms", nargs="+", help="a subset of the arms (e.g. online stale-32 …)")
    ap.add_argument("--stales", type=int, nargs="+", help="the stale S values (default 32)")
    ap.add_argument("--k-sweep", type=int, nargs="*", help="humanline k values at the largest S")
    ap.add_argument("--lags", type=int, nargs="*", help="async arms: online.mode async at lag "
                    "L, plain and humanline (async-L, async-L+humanline)")  # fmt: skip
    ap.add_argument("--deadline", type=float, help="time box in minutes: analyse the seeds "
                    "whose arms all completed by then")  # fmt: skip
    ap.add_argument("--unpinned", action="store_true", help="accept a base whose sha256 is "
                    "not testbed_env.BASE_SHA256 (recorded in the fingerprint)")  # fmt: skip
    args = ap.parse_args(argv)
    setup = quick_setup() if args.quick else Setup()
    for name in ("seeds", "steps", "lr", "prompts_per_step", "eval_points", "sft_steps", "sft_lr"):
        if getattr(args, name) is not None:
            setattr(setup, name, getattr(args, name))
    if args.stales is not None:
        setup.stales = tuple(args.stales)
    if args.k_sweep is not None:
        setup.k_sweep = tuple(args.k_sweep)
    if args.lags is not None:
        setup.lags = tuple(args.lags)
    setup.arm_names = tuple(args.arms) if args.arms else None
    if args.deadline is not None:
        setup.deadline_min = args.deadline or None
    unpinned = args.unpinned or args.quick  # --quick's base is a 2-step toy, never pinned
    summary = run(setup, args.out, args.command, args.base, args.only, unpinned)
    if args.command != "build" and args.only is None:
        png = args.png or (args.out / "testbed.png" if args.quick else REPO / "docs/testbed.png")
        tf.plot(summary, png)
        summary["png"] = str(png)
        (args.out / "results.md").write_text(tf.markdown(summary))
        summary["results_md"] = str(args.out / "results.md")
        # every figure, each arm's per-seed runs and the fingerprint (docs/testbed/*.json)
        (args.out / "results.json").write_text(json.dumps(summary, default=str, indent=1))
    summary["mode"] = "quick" if args.quick else "full"
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
