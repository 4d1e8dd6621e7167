"""The pure half of the vLLM engine: parameter, output and weight mapping (no vllm import).

Kept apart so it is unit-tested where vLLM cannot be installed, and so the engine module reads
as the engine.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainer.modeling.policy import trainable_state_dict_keys
from trainer.sampling.types import Completion, SamplingParams

DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


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


def hf_weight_items(state: dict[str, torch.Tensor] | nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs under the Hugging Face names vLLM's loader expects.

    A module contributes its parameters and persistent buffers, tied aliases once (vLLM skips a
    tied ``lm_head`` itself). DDP/FSDP wrappers must be unwrapped by the caller.
    """
    if isinstance(state, nn.Module):
        keys = set(trainable_state_dict_keys(state))  # no copies: a GPU policy stays put
        state = {k: v for k, v in state.state_dict().items() if k in keys}
    return [(name, tensor.detach()) for name, tensor in state.items()]


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
