"""FSDP2 vs DDP: step time and peak memory per process, 2 CPU processes, full fine-tuning.

Model: SmolLM2-135M's exact shape (30 layers, width 576, vocab 49152, tied head; config as in
trainer.modeling.sources' built-in) with random weights (the speed and memory of a step do not
depend on the values), tiny-llama's tokenizer. Job: offline+humanline DPO (k=1), fp32, global
batch 4 pairs of ~64 prompt + 64 completion tokens, launched exactly as the worker launches a
2-process CPU job (worker.launch: torchrun, gloo), once with `parallelism.strategy: ddp` and
once with `fsdp`, alternating `--repeats` times so machine drift hits both alike.

Each rank builds the trainer, runs the steps, then writes the end-of-run checkpoint and the
export, and reports its peak RSS (VmHWM) after the steps and after the checkpoint + export.

`--phases` also samples each rank's RSS every 3 ms and reports, for the last step of rank 0, the
peak inside each phase (policy forward, backward, clip, reference sync, optimizer step) and the
resting RSS after it: where in a step the peak comes from.

`--allocations` profiles the last step of rank 0 (torch.profiler, profile_memory) and reports
the peak of the tensors torch itself holds (the profiler's memory timeline): the memory the
two strategies really differ in, without the Python/torch baseline every process carries (its
step time is left out of the median).

Figures (targets from issue 11):
  step_time_ratio   median step time FSDP ÷ DDP, first step excluded (≤ 1.3)
  peak_rss_ratio    peak RSS per process FSDP ÷ DDP, the larger rank, whole run (≤ 0.6)
`--quick` runs the same on a 2-layer model of the same width and vocab for 3 steps (about a
minute on an idle 2-core machine; its memory ratio says little, the embedding dominates). The
last line printed is one JSON object with every figure and its target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from procfs import PhasePeaks, status_kb

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from gpu_models import SMOLLM2_SHAPE  # noqa: E402  (imports contract, on the path above)

WORDS = "the quick brown fox jumps over a lazy dog while seven bright stars watch quietly".split()


def peak_rss_mb() -> float:
    return status_kb("VmHWM") / 1024


def build_model(root: Path, layers: int) -> Path:
    """SmolLM2's shape, random weights (fp32), tiny-llama's tokenizer (ids < 512 fit any vocab)."""
    from trainer.modeling import load_tokenizer, resolve_model
    from trainer.modeling.sources import save_random_llama

    out = root / "model"
    shape = {**SMOLLM2_SHAPE, "num_hidden_layers": layers}
    tokenizer = load_tokenizer(resolve_model("tiny-llama"))
    save_random_llama(out, shape, tokenizer, seed=0, max_position_embeddings=8192)
    return out


def make_data(model_dir: Path, path: Path, n: int = 32, tokens: int = 64) -> Path:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)

    def text(count: int) -> str:
        words: list[str] = []
        while len(tok(" ".join(words), add_special_tokens=False)["input_ids"]) < count:
            words.append(WORDS[len(words) % len(WORDS)])
        return " ".join(words)

    prompt, answer = text(tokens), text(tokens - 2)
    rows = [
        {"prompt": f"{i} {prompt}", "chosen": f"yes {answer}", "rejected": f"no {answer}"}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def spec_dict(model_dir: Path, data: Path, strategy: str, steps: int, reshard: bool = True) -> dict:
    parallelism = {"strategy": strategy}
    if strategy == "fsdp":
        parallelism["reshard_after_forward"] = reshard
    return {
        "base_model": str(model_dir),
        "training_file": str(data),
        "objective": "dpo",
        "variant": "offline+humanline",
        "batch_size": 4,
        "max_steps": steps,
        "max_length": 256,
        "max_prompt_length": 128,
        "quality_sample": 0,
        "optim": {"lr": 1e-5, "warmup_ratio": 0.0},
        "parallelism": parallelism,
    }


# ---- one rank (started by torchrun through the worker's argv) ------------------------------------
def tensor_peak(run_step, out: Path) -> dict[str, float]:
    """Run one step under torch.profiler and read its memory timeline (CPU): the peak of the
    bytes held by tensors, and when in the step (0..1) it came."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:  # fmt: skip
        run_step()
    path = out / "memory-timeline.json"
    prof.export_memory_timeline(str(path), device="cpu")
    times, sizes = json.loads(path.read_text())
    totals = [sum(s) for s in sizes]
    at = max(range(len(totals)), key=totals.__getitem__)
    span = (times[-1] - times[0]) or 1
    return {
        "peak_mb": round(totals[at] / 2**20, 1),
        "end_mb": round(totals[-1] / 2**20, 1),
        "peak_at": round((times[at] - times[0]) / span, 3),
    }


def rank_main(spec_path: Path, out: Path) -> None:
    import torch

    from contract.spec import load_spec
    from trainer.train import Trainer

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    trainer = Trainer(load_spec(spec_path), out, progress=False)
    peaks = PhasePeaks() if os.environ.get("BENCH_PHASES") else None
    if peaks is not None:  # --phases: where in a step the memory peaks
        import trainer.train as loop

        peaks.wrap(loop, "batch_logps", "policy forward")
        peaks.wrap(trainer.accelerator, "backward", "backward")
        peaks.wrap(trainer.parallel, "clip_grad_norm_", "clip")
        peaks.wrap(trainer, "_refresh_reference", "reference sync")
        peaks.wrap(trainer.optimizer, "step", "optimizer step")
    rank = trainer.accelerator.process_index
    profiled = bool(os.environ.get("BENCH_ALLOCATIONS")) and rank == 0
    times, phases, allocations = [], [], None
    for step in range(1, trainer.total + 1):
        if profiled and step == trainer.total:
            allocations = tensor_peak(lambda s=step: trainer.step(s), out)
        else:
            times.append(trainer.step(step)["step_time"])
        if peaks is not None:
            phases.append({**peaks.take(), "resting": round(status_kb("VmRSS") / 1024, 1)})
    after_steps = peak_rss_mb()
    trainer.save(trainer.total)
    trainer.parallel.export(trainer.model, trainer.tokenizer, out / "final")
    trainer.accelerator.wait_for_everyone()
    (out / f"bench-rank-{rank}.json").write_text(
        json.dumps(
            {
                "step_times": times,
                "rss_after_steps_mb": after_steps,
                "rss_peak_mb": peak_rss_mb(),
                "phases": phases,
                "allocations": allocations,
            }
        )
    )
    trainer.parallel.close()


def run_job(
    root: Path,
    model_dir: Path,
    data: Path,
    strategy: str,
    steps: int,
    tag: str,
    reshard: bool = True,
    phases: bool = False,
    allocations: bool = False,
) -> dict:
    from worker.launch import trainer_command
    from worker.routing import Placement, trainer_env

    out = root / f"{strategy}-{tag}"
    spec = root / f"{strategy}-{tag}.json"
    spec.write_text(json.dumps(spec_dict(model_dir, data, strategy, steps, reshard)))
    place = Placement(2, cpu=True)
    argv = trainer_command(sys.executable, spec, out, resume=False, place=place)
    # the worker's launcher, pointed at this file's rank entry point instead of `-m trainer run`
    argv = argv[: argv.index("-m", 3)] + [
        str(Path(__file__).resolve()),
        "--rank",
        str(spec),
        str(out),
    ]
    env = {**trainer_env(place), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if phases:
        env["BENCH_PHASES"] = "1"
    if allocations:
        env["BENCH_ALLOCATIONS"] = "1"
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"{strategy} run failed:\n{proc.stderr[-4000:]}")
    ranks = [json.loads((out / f"bench-rank-{r}.json").read_text()) for r in (0, 1)]
    return {
        "wall_s": time.perf_counter() - t0,
        "step_s": statistics.median(ranks[0]["step_times"][1:] or ranks[0]["step_times"]),
        "rss_after_steps_mb": max(r["rss_after_steps_mb"] for r in ranks),
        "rss_peak_mb": max(r["rss_peak_mb"] for r in ranks),
        "rss_peak_per_rank_mb": [round(r["rss_peak_mb"], 1) for r in ranks],
        "phase_peaks_mb": ranks[0]["phases"][-1] if phases else None,  # rank 0, last step
        "tensor_peak": ranks[0]["allocations"],  # rank 0, last step (--allocations)
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--no-reshard",
        action="store_true",
        help=(
            "FSDP keeps each layer gathered from forward to backward "
            "(fewer all-gathers, more memory)"
        ),
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="also sample RSS inside each phase of a step (forward, backward, optimizer...)",
    )
    parser.add_argument(
        "--allocations",
        action="store_true",
        help="also profile rank 0's last step: the peak of the bytes torch's tensors hold",
    )
    parser.add_argument("--rank", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(Path(args.rank[0]), Path(args.rank[1]))
        return
    layers = 2 if args.quick else SMOLLM2_SHAPE["num_hidden_layers"]
    steps = args.steps or (3 if args.quick else 8)
    repeats = args.repeats or (1 if args.quick else 2)
    with tempfile.TemporaryDirectory(prefix="fsdp-bench-") as tmp:
        root = Path(tmp)
        model_dir = build_model(root, layers)
        data = make_data(model_dir, root / "pairs.jsonl")
        runs: dict[str, list[dict]] = {"ddp": [], "fsdp": []}
        for i in range(repeats):
            for strategy in ("ddp", "fsdp"):
                result = run_job(
                    root, model_dir, data, strategy, steps, str(i),
                    reshard=not args.no_reshard, phases=args.phases,
                    allocations=args.allocations,
                )  # fmt: skip
                runs[strategy].append(result)
                print(
                    f"{strategy} #{i}: step {result['step_s']:.3f} s, peak RSS per rank "
                    f"{result['rss_peak_per_rank_mb']} MB "
                    f"(after steps {result['rss_after_steps_mb']:.0f} MB), "
                    f"wall {result['wall_s']:.1f} s",
                    flush=True,
                )
                if result["phase_peaks_mb"]:
                    print(f"  {strategy} phase peaks (MB): {result['phase_peaks_mb']}", flush=True)
                if result["tensor_peak"]:
                    print(f"  {strategy} tensors (MB): {result['tensor_peak']}", flush=True)
    med = {
        s: {
            k: statistics.median(r[k] for r in rs)
            for k in ("step_s", "rss_peak_mb", "rss_after_steps_mb")
        }
        for s, rs in runs.items()
    }
    step_ratio = med["fsdp"]["step_s"] / med["ddp"]["step_s"]
    rss_ratio = med["fsdp"]["rss_peak_mb"] / med["ddp"]["rss_peak_mb"]
    tensor_ratio = None
    if args.allocations:  # rank 0's profiled last step, last repeat
        fsdp_mb, ddp_mb = (runs[s][-1]["tensor_peak"]["peak_mb"] for s in ("fsdp", "ddp"))
        tensor_ratio = round(fsdp_mb / ddp_mb, 3)
    summary = {
        "model": f"SmolLM2-135M shape, {layers} layers, random weights, fp32",
        "processes": 2,
        "steps": steps,
        "repeats": repeats,
        "quick": args.quick,
        "fsdp_reshard_after_forward": not args.no_reshard,
        "load_avg_1m": os.getloadavg()[0],
        "ddp_step_s": round(med["ddp"]["step_s"], 4),
        "fsdp_step_s": round(med["fsdp"]["step_s"], 4),
        "step_time_ratio": round(step_ratio, 3),
        "step_time_ratio_target": 1.3,
        "ddp_peak_rss_mb": round(med["ddp"]["rss_peak_mb"], 1),
        "fsdp_peak_rss_mb": round(med["fsdp"]["rss_peak_mb"], 1),
        "peak_rss_ratio": round(rss_ratio, 3),
        "peak_rss_ratio_target": 0.6,
        "peak_rss_ratio_steps_only": round(
            med["fsdp"]["rss_after_steps_mb"] / med["ddp"]["rss_after_steps_mb"], 3
        ),
        "phase_peaks_mb": {s: rs[-1]["phase_peaks_mb"] for s, rs in runs.items()},
        "tensor_peak": {s: rs[-1]["tensor_peak"] for s, rs in runs.items()},
        "tensor_peak_ratio": tensor_ratio,
        "met": {"step_time_ratio": step_ratio <= 1.3, "peak_rss_ratio": rss_ratio <= 0.6},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
