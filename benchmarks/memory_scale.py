"""Issue 25's CPU memory and speed benchmark: what chunked log-probs (item 2) and activation
checkpointing (item 3) save in one DPO training step, and whether the memory estimate
(contract.memory, item 6) predicts it.

DPO (offline), 8 pairs x (256 prompt + 256 completion) tokens, fp32, grad_accum 1, through the
trainer's own code (trainer.train.Trainer.step: the reference's forward, the policy's forward
and backward, the optimizer). One fresh process per configuration (glibc keeps freed pages, so
a second configuration in the same process would inherit the first's heap):

  vocab     a random Llama whose vocabulary dominates (hidden 256, 4 layers, vocab 128,256)
            today (full [rows, T, V] fp32 logits: trainer.logps.full_logits()) vs chunked
  smollm2   SmolLM2-135M's shape, random weights: today (full logits, checkpointing off) vs
            chunked + activation_checkpointing on; and the step time of chunked vs full logits,
            A/B steps interleaved in the "today" process, medians

"Activation peak" = the step's peak RSS (VmHWM, reset just before the step) minus the RSS just
before it, after a warm-up step has allocated AdamW's state and the gradients (kept allocated:
zero_grad(set_to_none=False), so that the static part - weights, gradients, optimizer state,
the reference copy, the data - is all in the "before"). The estimate is compared on the same
footing: its step parts (MemoryEstimate.step: activations, logits) ÷ that measured peak. Its
total ÷ the step's whole peak RSS is reported too, without a target (the runtime's and static
parts' ~1 GB would flatter the ratio).

    python benchmarks/memory_scale.py            # the shapes above, 8 pairs (minutes; ~12 GB)
    python benchmarks/memory_scale.py --quick    # the same roles scaled down (under a minute)
    python benchmarks/memory_scale.py --self-check   # tiny shapes, seconds: the logic only

Every process runs on --threads CPU threads (default OMP_NUM_THREADS, else 1: stepbench.
pin_threads), so the A/B step times share their threads whatever else the machine runs.

--quick keeps each role's defining proportion and scales the rest down: "vocab" a 32,768-word
vocabulary on a 64-wide, 4-layer model (4·V still ~4x the layers' saves a token), "smollm2" 30
layers 192 wide with a 16,384-word vocabulary (the head ~19 % of the weights, SmolLM2's 21 %;
4·V 0.13x the layers' saves, SmolLM2's 0.14x), 4 pairs x (64 + 64), and the log-probs' chunk
budget scaled with the tokens (8 MiB: ~8 chunks a step, as 256 MiB makes at the full size).

The last line printed is one JSON object: each figure with its target; exit 0 only when every
target is met (--self-check: when every configuration ran; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from stepbench import THREADS_HELP, pin_threads  # noqa: E402

from contract.memory import BUILTIN_SHAPES, ModelShape  # noqa: E402

SHAPES = {
    "vocab": ModelShape(128256, 256, 1024, 4, 4, 2, 64, True),
    "smollm2": BUILTIN_SHAPES["smollm2-135m-instruct"],
    # --self-check: the same two roles, tiny
    "vocab-tiny": ModelShape(8192, 32, 64, 2, 2, 1, 16, True),
    "smollm2-tiny": ModelShape(512, 64, 128, 4, 4, 2, 16, True),
    # --quick: the same two roles, scaled down (see the docstring)
    "vocab-quick": ModelShape(32768, 64, 256, 4, 4, 2, 16, True),
    "smollm2-quick": ModelShape(16384, 192, 512, 30, 3, 1, 64, True),
}
QUICK_CHUNK_BYTES = 8 << 20
# (name, shape, chunked log-probs, activation checkpointing, time A/B in this process)
CONFIGS = (
    ("vocab.today", "vocab", False, False, False),
    ("vocab.chunked", "vocab", True, False, False),
    ("smollm2.today", "smollm2", False, False, True),
    ("smollm2.chunked_ckpt", "smollm2", True, True, False),
)
TARGETS = {
    "vocab.activation_ratio": 0.3,  # item 2 alone
    "smollm2.activation_ratio": 0.3,  # items 2 and 3
    "smollm2.step_time_ratio": 1.05,  # item 2 alone
}
ESTIMATE_RANGE = (0.8, 1.25)


def full_logits():
    """trainer.logps.full_logits() (today's [rows, T, V] path) where the tree has it; before
    item 2 is merged there is no other path, so a no-op (and the figures say so)."""
    import trainer.logps

    cm = getattr(trainer.logps, "full_logits", None)
    return cm() if cm is not None else contextlib.nullcontext()


def has_chunked() -> bool:
    import trainer.logps

    return hasattr(trainer.logps, "full_logits")


# ---- one configuration, in its own process --------------------------------------------------
def spec_for(model: Path, data: Path, pairs: int, plen: int, clen: int, ckpt: bool):
    from contract.spec import JobSpec

    return JobSpec.model_validate(
        {
            "base_model": str(model),
            "training_file": str(data),
            "objective": "dpo",
            "variant": "offline",
            "batch_size": pairs,
            "grad_accum": 1,  # the whole batch in one micro-batch: what is measured
            "max_steps": 1000,
            "max_prompt_length": plen,
            "max_length": plen + clen,
            "precision": "fp32",
            "quality_sample": 0,
            "activation_checkpointing": "on" if ckpt else "off",
            "compile": "off",
        }
    )


def step_peak(fn) -> tuple[int, int, object]:
    """(RSS just before `fn()`, its peak RSS above that, its result), in bytes: VmHWM reset
    to the current RSS first (procfs.reset_peak)."""
    from procfs import reset_peak, status_kb

    gc.collect()
    before = status_kb("VmRSS")
    if not reset_peak():
        raise RuntimeError("cannot reset VmHWM (/proc/self/clear_refs): Linux >= 4.0 needed")
    result = fn()
    return before * 1024, (status_kb("VmHWM") - before) * 1024, result


def estimate(spec, shape: ModelShape, chunked: bool, ckpt: bool) -> tuple[int, int, str]:
    """(the estimate's step parts, its total) in bytes, and which estimate answered: item 6's
    (it knows chunking and checkpointing) or, before that is merged, today's (it knows
    neither: it prices every configuration as full logits without checkpointing)."""
    from contract.memory import estimate_training_memory as estimate_fn

    new: Any = estimate_fn  # item 6's keywords (mypy knows today's signature)
    if "checkpointing" in inspect.signature(estimate_fn).parameters:
        est = new(
            spec, shape, grad_accum=1, checkpointing=ckpt, chunked_logps=chunked, device="cpu"
        )
        which = "calibrated"
    else:
        est = estimate_fn(spec, shape)
        which = "today's (knows neither chunking nor checkpointing)"
    return sum(est.parts.get(k, 0) for k in est.step), est.total, which


def measure(cfg: dict) -> dict:
    """One configuration: warm-up step, then the measured step (and the A/B timing)."""
    import torch

    from trainer.distributed import return_freed_memory
    from trainer.modeling.policy import activation_checkpointing
    from trainer.train import Trainer

    return_freed_memory()  # as the CPU trainer does: large blocks go back to the system
    if cfg.get("chunk_bytes"):  # --quick: the chunk budget scaled with the tokens
        import contract.memory
        import trainer.chunked_logps

        trainer.chunked_logps.CHUNK_BYTES = cfg["chunk_bytes"]
        contract.memory.LOGPS_CHUNK_BYTES = cfg["chunk_bytes"]
    torch.manual_seed(0)
    spec = spec_for(
        Path(cfg["model"]), Path(cfg["data"]), cfg["pairs"], cfg["plen"], cfg["clen"], cfg["ckpt"]
    )
    tr = Trainer(spec, Path(cfg["out"]), progress=False)
    zero = tr.optimizer.zero_grad
    tr.optimizer.zero_grad = lambda set_to_none=None: zero(set_to_none=False)  # grads stay

    def step(i: int, chunked: bool) -> dict:
        with contextlib.nullcontext() if chunked else full_logits():
            return tr.step(i)

    step(1, cfg["chunked"])  # warm-up: gradients, AdamW state, kernels
    before, peak, _ = step_peak(lambda: step(2, cfg["chunked"]))
    batch = tr.batch_for(3, 0)
    est_step, est_total, which = estimate(spec, SHAPES[cfg["shape"]], cfg["chunked"], cfg["ckpt"])
    out: dict[str, Any] = {
        "static_rss_bytes": before,
        "activation_peak_bytes": peak,
        "rows": int(batch.input_ids.shape[0]),
        "tokens": batch.seq_tokens,  # prompt + completion (a shared prompt counts once)
        "checkpointing_active": bool(activation_checkpointing(tr.unwrapped)),
        "estimate_step_bytes": est_step,
        "estimate_total_bytes": est_total,
        "estimate": which,
    }
    if cfg["timing"]:  # item 2's step time: today (A) and chunked (B) in turn, medians
        times: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, list[float]] = {False: [], True: []}  # this process's CPU seconds
        for i in range(cfg["timed_steps"]):
            for chunked in (False, True) if i % 2 == 0 else (True, False):
                c0 = time.process_time()
                times[chunked].append(
                    step(3 + len(times[False]) + len(times[True]), chunked)["step_time"]
                )
                cpu[chunked].append(time.process_time() - c0)
        out["step_s_today"] = statistics.median(times[False])
        out["step_s_chunked"] = statistics.median(times[True])
        out["step_cpu_s_today"] = statistics.median(cpu[False])
        out["step_cpu_s_chunked"] = statistics.median(cpu[True])
    return out


# ---- the parent: models, data, one process per configuration, the figures -----------------------
def build(work: Path, shape_name: str, plen: int, clen: int) -> tuple[Path, Path]:
    """A random fp32 Llama of the shape with the tiny-llama tokenizer (ids < 512), and a pairs
    file a little longer than plen + clen (truncation makes every row exactly that long)."""
    import torch
    from gpu_models import pairs_file

    from trainer.modeling import load_tokenizer, resolve_model
    from trainer.modeling.sources import save_random_llama

    model = work / f"model-{shape_name}"
    if not (model / "config.json").exists():
        tok = load_tokenizer(resolve_model("tiny-llama"))
        shape = SHAPES[shape_name].llama_config()
        save_random_llama(
            model, shape, tok, seed=0, max_position_embeddings=2048, dtype=torch.float32
        )
    data = pairs_file(model, work / f"pairs-{shape_name}.jsonl", 64, plen + 8, clen + 8)
    return model, data


def run_config(cfg: dict, in_process: bool = False) -> dict:
    """`cfg` measured in a fresh process (`in_process`: here, for --self-check, whose tiny
    figures mean nothing and whose four process starts would cost a minute on a busy CPU)."""
    if in_process:
        return measure(cfg)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(cfg)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{cfg['name']} exited {proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def figures(results: dict[str, dict], self_check: bool) -> dict[str, dict]:
    """Each figure with its target and whether it is met (None: reported, no target)."""
    out: dict[str, dict] = {}

    def fig(name: str, value, target: str | None = None, ok: bool | None = None) -> None:
        value = round(value, 4) if isinstance(value, float) else value
        out[name] = {"value": value, "target": target, "met": ok}

    for name, r in results.items():
        tokens = r["tokens"]
        fig(f"{name}.activation_peak_mb", r["activation_peak_bytes"] / 1e6)
        fig(f"{name}.activation_mb_per_token", r["activation_peak_bytes"] / 1e6 / tokens)
        fig(f"{name}.static_rss_mb", r["static_rss_bytes"] / 1e6)
        fig(f"{name}.checkpointing_active", r["checkpointing_active"])
        ratio = r["estimate_step_bytes"] / max(r["activation_peak_bytes"], 1)
        lo, hi = ESTIMATE_RANGE
        fig(f"{name}.estimate_over_measured", ratio, f"in [{lo}, {hi}]", lo <= ratio <= hi)
        total = r["static_rss_bytes"] + r["activation_peak_bytes"]
        fig(f"{name}.estimate_total_over_peak_rss", r["estimate_total_bytes"] / total)
    pairs = (("vocab", "vocab.today", "vocab.chunked"),
             ("smollm2", "smollm2.today", "smollm2.chunked_ckpt"))  # fmt: skip
    for shape, today, new in pairs:
        if today in results and new in results:
            ratio = results[new]["activation_peak_bytes"] / results[today]["activation_peak_bytes"]
            t = TARGETS[f"{shape}.activation_ratio"]
            fig(f"{shape}.activation_ratio", ratio, f"<= {t}", ratio <= t)
    if "smollm2.today" in results:
        r = results["smollm2.today"]
        fig("smollm2.step_s_today", r["step_s_today"])
        fig("smollm2.step_s_chunked", r["step_s_chunked"])
        ratio = r["step_s_chunked"] / r["step_s_today"]
        t = TARGETS["smollm2.step_time_ratio"]
        fig("smollm2.step_time_ratio", ratio, f"<= {t}", ratio <= t)
        if "step_cpu_s_today" in r:  # CPU seconds: less at the mercy of a busy machine
            cpu = r["step_cpu_s_chunked"] / r["step_cpu_s_today"]
            fig("smollm2.step_cpu_time_ratio", cpu)
    if self_check:  # tiny shapes: the figures exist, their values mean nothing
        for f in out.values():
            f["met"] = None if f["target"] else f["met"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="the roles scaled down, 4 pairs x (64 + 64), 2 timed A/B step pairs (under 60 s)",
    )
    ap.add_argument("--self-check", action="store_true", help="tiny shapes: the logic only")
    ap.add_argument("--pairs", type=int, default=None, help="DPO pairs per step (default 8)")
    ap.add_argument("--timed-steps", type=int, default=None, help="A/B step pairs (default 8)")
    ap.add_argument("--only", default=None, help="comma-separated configuration names")
    ap.add_argument("--work", type=Path, default=None, help="scratch dir (models are reused)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    args = ap.parse_args(argv)
    # the step-time ratio needs both sides on the same threads: pinned here and inherited by
    # every configuration's process (a child re-reads OMP_NUM_THREADS and pins it too)
    threads = pin_threads(args.threads)
    if args.child:
        print(json.dumps(measure(json.loads(args.child))))
        return 0
    plen = clen = 16 if args.self_check else 64 if args.quick else 256
    # fewer pairs alone would not keep the ratios: a chunked step holds a part that does not
    # grow with the batch (~0.7 GB at the vocab shape: at 2 pairs its ratio read 0.36 where 8
    # pairs read 0.14); --quick scales that part down with the shapes and the chunk budget
    pairs = args.pairs or (2 if args.self_check else 4 if args.quick else 8)
    timed = args.timed_steps or (1 if args.self_check else 2 if args.quick else 8)
    suffix = "-tiny" if args.self_check else "-quick" if args.quick else ""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = args.work or Path(tempfile.mkdtemp(prefix="hl-memscale-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HUMANLINE_CACHE", str(work / "cache"))
    t0 = time.perf_counter()
    results, errors = {}, {}
    only = set(args.only.split(",")) if args.only else None
    for name, shape, chunked, ckpt, timing in CONFIGS:
        if only is not None and name not in only:
            continue
        shape += suffix
        model, data = build(work, shape, plen, clen)
        cfg = {
            "name": name, "shape": shape, "model": str(model), "data": str(data),
            "out": str(work / f"run-{name}"), "pairs": pairs, "plen": plen, "clen": clen,
            "chunked": chunked, "ckpt": ckpt, "timing": timing, "timed_steps": timed,
            "chunk_bytes": QUICK_CHUNK_BYTES if args.quick else None,
        }  # fmt: skip
        t1 = time.perf_counter()
        try:
            results[name] = run_config(cfg, in_process=args.self_check)
        except Exception as exc:  # noqa: BLE001  (one failed configuration: the others still report)
            errors[name] = str(exc)[-2000:]
        print(f"[{name}] {time.perf_counter() - t1:.1f} s: {results.get(name)}", flush=True)
    figs = figures(results, args.self_check)
    unmet = [n for n, f in figs.items() if f["met"] is False]
    summary = {
        "mode": "self-check" if args.self_check else "quick" if args.quick else "full",
        "shapes": sorted({f"{c[1]}{suffix}" for c in CONFIGS}),
        "pairs": pairs,
        "prompt_tokens": plen,
        "completion_tokens": clen,
        "chunked_logps_in_tree": has_chunked(),
        "threads": threads,
        "estimate": next((r["estimate"] for r in results.values()), None),
        "seconds": round(time.perf_counter() - t0, 1),
        "figures": figs,
        "errors": errors,
        "unmet": unmet,
        "ok": not errors and not unmet,
    }
    print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
