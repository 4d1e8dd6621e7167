"""Sampling G completions per prompt from the current policy: one interface, two engines.

``make_sampler`` is the one place the engine is chosen. vLLM (GPU, fast) is used when it is
importable and a CUDA device is present; otherwise transformers ``generate`` on the live policy
(slow, but needs nothing else). The choice and its reason are logged.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any, Literal

from torch import nn

from trainer.sampling.types import Completion, Prompt, Sampler, SamplingParams

log = logging.getLogger(__name__)

Engine = Literal["auto", "vllm", "hf"]

__all__ = ["Completion", "Engine", "Prompt", "Sampler", "SamplingParams", "make_sampler"]


def _vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def vllm_unavailable_reason() -> str | None:
    """Why vLLM cannot be used here, or None if it can (importable and a GPU present)."""
    import torch

    if not _vllm_installed():
        return "vllm is not installed (pip install 'humanline[gpu]')"
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    return None


def make_sampler(
    engine: Engine,
    model_dir: Path | str,
    tokenizer: Any,
    policy: nn.Module | None = None,
    vllm_options: dict[str, Any] | None = None,
    **options: Any,
) -> Sampler:
    """Build the sampler for one job.

    ``policy`` is the live module: the HF engine samples from it directly, the vLLM engine
    starts from its current weights (and learns from it whether it is a LoRA policy). Without a
    policy the HF engine loads its own copy of ``model_dir`` (evaluation, benchmarks).
    ``options`` go to the engine (``max_batch_rows`` for HF; ``gpu_memory_utilization``,
    ``max_model_len``, ... for vLLM); ``vllm_options`` go to the vLLM engine only, when it is
    the one chosen (an online job's ``engine_options``).
    """
    if engine not in ("auto", "vllm", "hf"):
        raise ValueError(f"unknown sampling engine {engine!r}; expected auto, vllm or hf")
    if engine == "auto":
        reason = vllm_unavailable_reason()
        if reason is None:
            engine = "vllm"
        else:
            log.warning("sampling with transformers generate (slow) instead of vLLM: %s", reason)
            engine = "hf"
    if engine == "vllm":
        if not _vllm_installed():
            raise RuntimeError("sampling engine 'vllm' was requested but vllm is not installed")
        from trainer.sampling.vllm_engine import VLLMSampler

        log.info("sampling with vLLM from %s", model_dir)
        return VLLMSampler(
            Path(model_dir), tokenizer, policy=policy, **{**(vllm_options or {}), **options}
        )

    from trainer.sampling.hf_engine import HFSampler

    if policy is None:
        return HFSampler.from_dir(Path(model_dir), tokenizer, **options)
    return HFSampler(policy, tokenizer, **options)
