"""vLLM settings of an online job (``online.vllm``): used only when the job samples with vLLM.

No torch or vllm here (the API validates specs with this module). Each value left unset is
resolved from the rest of the spec by the trainer (``trainer.sampling.vllm_params.engine_options``),
the one place those defaults are decided.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from contract.strict import StrictNumbers


class VLLMConfig(StrictNumbers):
    """How the job's vLLM engine is sized and run. One engine per training process, on that
    process's own GPU (see docs/vllm.md)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    max_model_len: int | None = Field(
        None,
        ge=16,
        description="Longest prompt + completion the engine serves. "
        "Default: max_prompt_length + online.max_new_tokens.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto",
        description="Engine precision. 'auto': the job's precision (bf16 -> bfloat16, fp16 -> "
        "float16, fp32 -> float32), not the fp32 master weights of full fine-tuning.",
    )
    gpu_memory_utilization: float = Field(
        0.3,
        gt=0,
        le=0.95,
        description="Share of the GPU the engine may hold (weights + KV cache); the trainer "
        "shares the device. Ignored when kv_cache_gib is set, and on CPU.",
    )
    kv_cache_gib: float | None = Field(
        None,
        gt=0,
        description="KV cache size in GiB, instead of sizing it from gpu_memory_utilization. "
        "On vLLM's CPU backend the default is 1 GiB (at most a quarter of free RAM).",
    )
    sleep_between_rounds: bool = Field(
        False,
        description="Put the engine to sleep (level 1: weights to CPU RAM, KV cache freed) "
        "while the trainer trains, and wake it at the next round. GPU only.",
    )
    enforce_eager: bool = Field(
        False, description="No CUDA graphs / compilation: faster start, slower sampling."
    )
