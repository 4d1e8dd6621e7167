"""The `scale` part of benchmarks/gpu_smoke.py (issue 25, item 7): the shapes users train.

Runs, humanline DPO in bf16, random weights built on the device (no weights travel, nothing is
written to disk but config.json and the tokenizer):

  1b.s256        Llama-3.2-1B's shape (1.24 B), full fine-tuning, 8 pairs x (256 + 256)
  1b.s256.ckpt   the same with activation_checkpointing on (its activation memory per token)
  1b.s2560       the same shape at 4 pairs x (512 + 2048) (the math preset's lengths)
  8b.lora        Llama-3.1-8B's shape, LoRA r16, 8 pairs x (512 + 512), the DEFAULT spec (no
                 grad_accum: the trainer picks the micro-batch), capped at 80 GB on a larger GPU

Each reports tokens/s, MFU (6N full fine-tuning, 4N LoRA, attention added as PaLM counts it),
HFU (plus the reference/lookahead forward, 2N, and checkpointing's recomputed forward, 2N),
peak GiB (torch.cuda.max_memory_allocated), activation MB per token of the micro-batch (peak
minus the static part, gradients kept allocated), estimate ÷ measured (contract.memory), the
micro-batch chosen and the GPU-busy share of two profiled steps (the union of CUDA kernel
intervals, so overlapping streams count once, over their wall time).

Item 4's changes that can be switched inside one trainer are also timed A/B in the 1b.s256
process (`ab_steps`: steps interleaved on/off/off/on, medians, on ÷ off): chunked log-probs
against today's full logits (trainer.logps.full_logits) and the kept softmax against the
recompute (trainer.logps.keep_softmax). Checkpointing is the 1b.s256.ckpt run beside 1b.s256;
compile and the FSDP2 mixed-precision policy are set when a model is built, so not here.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import json
import os
import statistics
import time
import traceback
from pathlib import Path
from typing import Any

from gpu_models import EIGHT_B_SHAPE, ONE_B_SHAPE, TINY_SHAPE, pairs_file

MEMORY_LIMIT_ENV = "HUMANLINE_TRAIN_MEMORY_GIB"  # trainer.memory's: the memory the trainer may use
GPU_CAP_GIB = 80.0  # the 8 B LoRA run must fit an 80 GB H100: capped there on a larger GPU
# (name, shape, adapter, pairs, prompt tokens, completion tokens, activation checkpointing)
RUNS = (
    ("1b.s256", ONE_B_SHAPE, "full", 8, 256, 256, "off"),
    ("1b.s256.ckpt", ONE_B_SHAPE, "full", 8, 256, 256, "on"),
    ("1b.s2560", ONE_B_SHAPE, "full", 4, 512, 2048, None),
    ("8b.lora", EIGHT_B_SHAPE, "lora", 8, 512, 512, None),
)
SELF_CHECK_LENGTHS = {256: 16, 512: 24, 2048: 32}  # tiny shapes, short rows, on the CPU


def busy_share(events, wall_s: float) -> float:
    """Seconds some CUDA kernel (or copy) ran ÷ `wall_s`: the union of the device events'
    [start, end) intervals (microseconds), so two streams at once count once."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events)
    busy, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop <= end:
            continue
        busy += stop - max(start, end)
        end = stop
    return busy / 1e6 / wall_s


def flops_per_token(n_params: int, shape: dict, seq: int, lora: bool, ckpt: bool) -> tuple:
    """(model FLOPs, hardware FLOPs) per token. Model: 6N (full) or 4N (LoRA: no weight
    gradients of the frozen base) + PaLM's attention term 12·L·h·T. Hardware adds the forward
    passes that run but train nothing: the reference/lookahead forward and, with activation
    checkpointing, the recomputed forward (2N + 4·L·h·T each)."""
    attention = 12 * shape["num_hidden_layers"] * shape["hidden_size"] * seq
    model = (4 if lora else 6) * n_params + attention
    extra_forward = 2 * n_params + attention // 3
    return model, model + extra_forward * (2 if ckpt else 1)


class Memory:
    """What the device's memory counts: bytes allocated by torch on a GPU (the CUDA context
    and the allocator's cache excluded), the process's RSS on the CPU self-check (benchmarks/
    procfs.py), with the peak since `reset()`."""

    def __init__(self, on_gpu: bool):
        import torch

        self.on_gpu, self.cuda = on_gpu, torch.cuda

    def reset(self) -> None:
        if self.on_gpu:
            self.cuda.synchronize()
            self.cuda.reset_peak_memory_stats()
        else:
            from procfs import reset_peak

            reset_peak()

    def now(self) -> int:
        from procfs import status_kb

        return self.cuda.memory_allocated() if self.on_gpu else status_kb("VmRSS") * 1024

    def peak(self) -> int:
        from procfs import status_kb

        return self.cuda.max_memory_allocated() if self.on_gpu else status_kb("VmHWM") * 1024


@contextlib.contextmanager
def built_on_device(device: str, seed: int):
    """trainer.modeling.policy loads the base model with AutoModelForCausalLM.from_pretrained;
    inside this, it gets random weights of the directory's config made on `device` instead
    (an 8 B shape: ~20 s on an H200, vs writing and reading 16 GB)."""
    import torch
    from transformers import AutoModelForCausalLM

    import trainer.modeling.policy as policy

    class OnDevice:
        @staticmethod
        def from_pretrained(model_dir, *, config, dtype, **kw):
            torch.manual_seed(seed)
            with torch.device(device):
                return AutoModelForCausalLM.from_config(config, dtype=dtype)

    own = getattr(policy, "AutoModelForCausalLM", None)
    if own is None:
        raise RuntimeError("trainer.modeling.policy no longer loads with AutoModelForCausalLM")
    policy.AutoModelForCausalLM = OnDevice
    try:
        yield
    finally:
        policy.AutoModelForCausalLM = own


def config_dir(out: Path, shape: dict) -> Path:
    """config.json and the tiny-llama tokenizer only: built_on_device makes the weights."""
    from transformers import LlamaConfig

    from trainer.modeling import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model("tiny-llama"))
    LlamaConfig(
        **shape, max_position_embeddings=8192, attention_dropout=0.0, dtype="bfloat16",
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    ).save_pretrained(out)  # fmt: skip
    tok.save_pretrained(out)
    return out


def chosen(tr, out: Path) -> tuple[int, int, str]:
    """(pairs per micro-batch, grad_accum, where that was read): the trainer's choice
    (`Trainer.memory`, what its started event reports), else a started event, else the spec."""
    choice = getattr(tr, "memory", None)
    if choice is not None and hasattr(choice, "micro_examples"):
        return choice.micro_examples, choice.grad_accum, "Trainer.memory"
    events = out / "events.jsonl"
    for line in events.read_text().splitlines() if events.exists() else []:
        event = json.loads(line)
        if event["kind"] == "started" and "grad_accum" in event["data"]:
            data = event["data"]
            return data.get("micro_batch"), data["grad_accum"], "started event"
    accum = tr.spec.grad_accum or 1
    return tr.spec.examples_per_batch // accum, accum, "spec"


def estimate(spec, config: dict, accum: int, ckpt: bool, device: str):
    """contract.memory's estimate for what ran (item 6's signature; today's before it)."""
    from contract.memory import ModelShape
    from contract.memory import estimate_training_memory as estimate_fn

    shape = ModelShape.from_config(config)
    new: Any = estimate_fn  # item 6's keywords (mypy knows today's signature)
    if "checkpointing" in inspect.signature(estimate_fn).parameters:
        return new(
            spec, shape, grad_accum=accum, checkpointing=ckpt, chunked_logps=True, device=device
        )
    return estimate_fn(spec, shape)


def default_spec_supported() -> bool:
    """The trainer picks the micro-batch when grad_accum is unset (item 1)."""
    import importlib.util

    import contract.memory

    moved = importlib.util.find_spec("contract.micro_batch") is not None  # where it lives now
    return moved or hasattr(contract.memory, "choose_micro_batch")


def one_run(r, s, name, shape, adapter, pairs, plen, clen, ckpt, peak_tflops) -> None:
    import torch

    from trainer.modeling.policy import activation_checkpointing
    from trainer.train import Trainer

    on_gpu = torch.cuda.is_available()
    sync = torch.cuda.synchronize if on_gpu else lambda: None
    model_dir = config_dir(s.work / f"scale-{name}-model", shape)
    data = pairs_file(model_dir, s.work / f"scale-{name}.jsonl", 2 * pairs, plen + 8, clen + 8)
    extra: dict = {} if ckpt is None else {"activation_checkpointing": ckpt}
    if not default_spec_supported():  # today's trainer cannot run grad_accum unset
        extra["grad_accum"] = 1
        r.figure(f"scale.{name}.note", "this tree cannot choose a micro-batch: grad_accum 1")
    spec = s.spec(
        "offline+humanline", adapter, base_model=str(model_dir), training_file=str(data),
        batch_size=pairs, max_prompt_length=plen, max_length=plen + clen, max_steps=100,
        **extra,
    )  # fmt: skip
    capped = on_gpu and name.startswith("8b")
    if capped:  # the allocator stops at 80 GB, and the trainer's choice budgets for 80 GB
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, GPU_CAP_GIB * 2**30 / total))
        os.environ[MEMORY_LIMIT_ENV] = str(GPU_CAP_GIB)
    mem = Memory(on_gpu)
    try:
        mem.reset()
        t0 = time.perf_counter()
        out = s.work / f"scale-{name}"
        with built_on_device("cuda" if on_gpu else "cpu", seed=1):
            tr = Trainer(spec, out, progress=False)
        r.figure(f"scale.{name}.build_s", time.perf_counter() - t0)
        warm, timed = (1, 1) if s.self_check else (2, 6)
        rows = [tr.step(i) for i in range(1, warm + timed + 1)]
        tps = statistics.median(m["tokens_per_s"] for m in rows[warm:])
        step = warm + timed
        peak = mem.peak()
        # the GPU-busy share of two profiled steps
        activities = [torch.profiler.ProfilerActivity.CPU]
        if on_gpu:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            sync()
            t1 = time.perf_counter()
            for _ in range(2):
                step += 1
                tr.step(step)
            sync()
            wall = time.perf_counter() - t1
        device_events = [  # kernels, copies, sets; not the annotations that span them
            e for e in prof.events()
            if e.device_type.name == "CUDA" and not getattr(e, "is_user_annotation", False)
        ]  # fmt: skip
        busy = busy_share(device_events, wall)
        # activations: the step's peak above the static part (gradients kept allocated)
        zero = tr.optimizer.zero_grad
        tr.optimizer.zero_grad = lambda set_to_none=None: zero(set_to_none=False)
        step += 1
        tr.step(step)  # allocates the gradients, which now stay
        batch = tr.batch_for(step + 1, 0)
        tokens = batch.input_ids.numel() + (
            batch.prefix.input_ids.numel() if batch.prefix is not None else 0
        )
        gc.collect()
        mem.reset()
        static = mem.now()
        step += 1
        tr.step(step)
        act = mem.peak() - static
        tr.optimizer.zero_grad = zero
        ab = ab_steps(tr, step + 1, 1 if s.self_check else 3)[0] if name == "1b.s256" else {}
        micro, accum, source = chosen(tr, out)
        active = bool(activation_checkpointing(tr.unwrapped))
        n_params = sum(p.numel() for p in tr.unwrapped.parameters())
        model_f, hw_f = flops_per_token(n_params, shape, plen + clen, adapter == "lora", active)
        est = getattr(getattr(tr, "memory", None), "estimate", None) or estimate(
            spec, shape_config(model_dir), accum, active, "cuda" if on_gpu else "cpu"
        )  # the trainer's own (item 1 chose the micro-batch with it), else computed here
    finally:
        if capped:
            torch.cuda.set_per_process_memory_fraction(1.0)
            os.environ.pop(MEMORY_LIMIT_ENV, None)
    name = f"scale.{name}"
    r.figure(f"{name}.params", n_params)
    r.figure(f"{name}.tokens_per_s", tps)
    mfu = tps * model_f / (peak_tflops * 1e12) if peak_tflops else None
    if name in ("scale.1b.s256", "scale.8b.lora"):
        r.figure(f"{name}.mfu", mfu, ">= 0.40", mfu is not None and mfu >= 0.40, gpu_only=True)
    else:
        r.figure(f"{name}.mfu", mfu)
    r.figure(f"{name}.hfu", tps * hw_f / (peak_tflops * 1e12) if peak_tflops else None)
    r.figure(f"{name}.peak_gib", peak / 2**30)
    r.figure(f"{name}.micro_batch_pairs", micro)
    r.figure(f"{name}.grad_accum", accum)
    r.figure(f"{name}.micro_batch_from", source)
    r.figure(f"{name}.activation_checkpointing", active)
    ratio = est.total / peak
    ok = 0.75 <= ratio <= 1.25
    r.figure(f"{name}.estimate_over_measured", ratio, "in [0.75, 1.25]", ok, gpu_only=True)
    r.figure(f"{name}.estimate_gib", est.gib)
    mb_per_token = act / 1e6 / tokens
    if name in ("scale.1b.s256", "scale.1b.s256.ckpt"):
        limit = 0.15 if ckpt == "on" else 1.0  # and checkpointing must be as asked
        ok = mb_per_token <= limit and active == (ckpt == "on")
        r.figure(f"{name}.activation_mb_per_token", mb_per_token, f"<= {limit}", ok, gpu_only=True)
    else:
        r.figure(f"{name}.activation_mb_per_token", mb_per_token)
    if name == "scale.1b.s256":
        r.figure(f"{name}.gpu_busy", busy, ">= 0.90", busy >= 0.90, gpu_only=True)
    else:
        r.figure(f"{name}.gpu_busy", busy)
    for change, ratio in ab.items():  # item 4's A/B: on ÷ off step time, one process
        r.figure(f"{name}.ab.{change}.step_time_on_over_off", ratio)
    if name == "scale.8b.lora":
        fits = peak <= GPU_CAP_GIB * 2**30
        r.figure(f"{name}.fits_80gb", fits, "true", fits, gpu_only=True)
    del tr


def ab_toggles(tr) -> dict[str, Any]:
    """name -> (switch on, switch off): each a function returning a context manager in which a
    step runs with the change on or off (trainer.logps's own switches)."""
    from trainer import logps

    def keep(on: bool):
        @contextlib.contextmanager
        def cm():
            before = tr.memory.keep_softmax
            logps.keep_softmax(tr.unwrapped, on)
            try:
                yield
            finally:
                logps.keep_softmax(tr.unwrapped, before)

        return cm

    return {
        "chunked_logps": (contextlib.nullcontext, logps.full_logits),
        "keep_softmax": (keep(True), keep(False)),
    }


def ab_steps(tr, first: int, pairs: int) -> tuple[dict[str, float], int]:
    """{change: median on-step time ÷ median off-step time} over `pairs` on/off pairs per
    change, interleaved on/off then off/on; returns the next free step number too."""
    out, step = {}, first
    for name, (on, off) in ab_toggles(tr).items():
        times: dict[bool, list[float]] = {True: [], False: []}
        for i in range(pairs):
            for state in (True, False) if i % 2 == 0 else (False, True):
                with (on if state else off)():
                    times[state].append(tr.step(step)["step_time"])
                step += 1
        out[name] = statistics.median(times[True]) / statistics.median(times[False])
    return out, step


def shape_config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def part_scale(r, s, peak_tflops: float | None, peak_table: dict[str, float]) -> None:
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    peak = peak_tflops or next((v for k, v in peak_table.items() if k in name), None)
    r.figure("scale.peak_tflops_assumed", peak)
    failed: dict[str, str] = {}
    for run, shape, adapter, pairs, plen, clen, ckpt in RUNS:
        if s.self_check:
            shape, pairs = TINY_SHAPE, 2
            plen, clen = SELF_CHECK_LENGTHS[plen], SELF_CHECK_LENGTHS[clen]
        try:
            one_run(r, s, run, shape, adapter, pairs, plen, clen, ckpt, peak)
        except Exception as exc:  # noqa: BLE001  (an OOM in one run: the others still report)
            traceback.print_exc()
            failed[run] = f"{type(exc).__name__}: {exc}"[:500]
        gc.collect()  # the run's model and optimizer state go before the next is built
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if failed:
        raise RuntimeError(f"scale runs failed: {failed}")
