"""Data parallelism behind one interface: replicated (DDP through accelerate) or sharded (FSDP2).

The training loop (trainer.train) asks its `Parallel` for everything that differs between the
two: wrapping the model and optimizer, skipping gradient sync on accumulation micro-steps,
gradient clipping, the trainable weights and optimizer state of a checkpoint, a frozen
reference copy, and the final export. `make_parallel` picks one from `spec.parallelism`
(contract.parallel); every method is collective (every rank calls it) unless it says otherwise.

Sharded (`fully_shard`): every decoder layer (the model's `_no_split_modules`) and then the
root are sharded over one mesh of all processes; parameters become DTensors (Shard(0)),
gradients are reduce-scattered, AdamW keeps 1/N of its state per process. On a process that
was started alone, a one-process group is made, so the FSDP code path also runs on one device.

Checkpoints (trainer.checkpoint) go through torch.distributed.checkpoint for both strategies:
`checkpoint_state` is get_state_dict's {model, optimizer} (under FSDP each rank's shards, so
no rank gathers the model; under DDP the replicated tensors, which DCP writes once, spread over
the ranks), the weights renamed as trainable_state_dict names them. DCP reshards on load, so a
checkpoint resumes at another world size or strategy. The v1 loaders (`load_trainable_state`,
`load_optimizer`) stay for checkpoints written before. The final export of a sharded full
model is written without gathering it on one rank (trainer.dtensors.write_sharded_export).

HSDP (`parallelism.hsdp`, with `nodes`): the mesh is 2-D, (nodes, processes per node) named
("replicate", "shard"): each node holds one sharded copy, gradients are reduce-scattered
within a node and all-reduced across nodes.

Forward passes of a sharded model are collective (each layer all-gathers its weights), so
every rank must run the same number of forwards in the same order: batches take one layout on
every rank (`share_prompts`: on the CPU always the two-pass shared-prefix one, on a GPU never),
and scoring that DDP does on rank 0 alone (the data-quality signal) runs on every rank.

Where rows share a prompt (DPO's chosen and rejected), the prompt gets one pass of its own only
on the CPU, where arithmetic bounds a step and the rows' passes shrink by the prompt's tokens.
On a GPU a step of a small model is bound by kernel launches, which a second pass doubles:
on an H100 (benchmarks/gpu_smoke.py's shapes, bf16, humanline DPO, 128 + 128 tokens) one pass
made a SmolLM2-135M step 1.86x faster at batch 8 and 1.78x at batch 32, and a Llama-3.2-1B
step (256 + 256 tokens, batch 8) was even (0.97x).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from peft import PeftModel
from torch import Tensor, nn

from contract.parallel import ParallelConfig
from trainer.checkpoint import load_state
from trainer.dtensors import (  # noqa: F401 (re-exported)
    _checkpoint_keys,
    _full,
    _is_dtensor,
    _local,
    _unique_keys,
    write_sharded_export,
)
from trainer.modeling import (
    activation_checkpointing,
    load_trainable_state_dict,
    save_pretrained_weights,
)

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
HSDP_DIMS = ("replicate", "shard")


def _plain(optimizer) -> torch.optim.Optimizer:
    """The torch optimizer under accelerate's wrapper (DCP's state-dict helpers want it)."""
    return getattr(optimizer, "optimizer", optimizer)


class Replicated:
    """DDP (several processes) or a plain run (one): accelerate does the work."""

    name = "ddp"
    cpu_share_prompts: bool | str = True  # on the CPU: a prompt pass when a batch's rows share it
    collective_forward = False

    def __init__(self, accelerator):
        self.acc = accelerator
        cpu = accelerator.device.type == "cpu"
        # collate's layout (the module docstring): a shared prompt pass pays off on the CPU only
        self.share_prompts: bool | str = self.cpu_share_prompts if cpu else False
        if cpu:
            return_freed_memory()

    def wrap(self, model: nn.Module) -> nn.Module:
        self._fit_layout(model)
        return self.acc.prepare(model)

    def _fit_layout(self, model: nn.Module) -> None:
        """Checkpointed layers run without a KV cache (transformers' GradientCheckpointingLayer
        drops `past_key_values` in train mode, grad or not), and the shared-prompt layout
        passes the prompt to the rows through that cache: with checkpointing every batch takes
        the one-pass layout, on every rank (the prompt's tokens are computed once per row)."""
        if activation_checkpointing(model):
            self.share_prompts = False

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer):
        return self.acc.prepare(optimizer)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return self.acc.unwrap_model(model)

    @contextmanager
    def accumulate(self, model: nn.Module, sync: bool) -> Iterator[None]:
        """Gradients of a micro-step: averaged across ranks only when `sync` (the last one)."""
        if sync:
            yield
        else:
            with self.acc.no_sync(model):
                yield

    def clip_grad_norm_(self, params: list[Tensor], max_norm: float) -> Tensor:
        return self.acc.clip_grad_norm_(params, max_norm)

    def checkpoint_state(self, model: nn.Module, optimizer) -> dict:
        """{"model": trainable weights by trainable_state_dict's names, "optim": AdamW state}
        as torch.distributed.checkpoint's get_state_dict gives them: this rank's shards under
        FSDP (nothing gathered), the tensors themselves under DDP. What DCP saves and loads."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(ignore_frozen_params=True)
        weights, optim = get_state_dict(model, _plain(optimizer), options=options)
        keys = _checkpoint_keys(self.unwrap(model))
        return {"model": {keys[k]: v for k, v in weights.items() if k in keys}, "optim": optim}

    def load_checkpoint_state(self, model: nn.Module, optimizer, state: dict) -> None:
        """Put `state` (checkpoint_state's layout, loaded by DCP) into the model and optimizer."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        keys = _checkpoint_keys(self.unwrap(model))
        names = {name: key for key, name in keys.items()}
        if state["model"].keys() != names.keys():
            raise ValueError("the checkpoint's weights do not match the model")
        weights = {names[k]: v for k, v in state["model"].items()}
        # strict=False forgives only the tied aliases checkpoint_state leaves out
        options = StateDictOptions(ignore_frozen_params=True, strict=False)
        set_state_dict(
            model,
            _plain(optimizer),
            model_state_dict=weights,
            optim_state_dict=state["optim"],
            options=options,
        )

    def load_trainable_state(self, model: nn.Module, state: dict[str, Tensor]) -> None:
        load_trainable_state_dict(self.unwrap(model), state)

    def load_optimizer(self, optimizer, directory: Path) -> None:
        optimizer.load_state_dict(load_state(directory / "optimizer.pt"))

    def frozen_copy(self, model: nn.Module) -> nn.Module:
        """A frozen copy of the (unwrapped) initial model, for the `none` reference."""
        return copy.deepcopy(model)

    def export(self, model: nn.Module, tokenizer, out_dir) -> None:
        """Rank 0 writes a plain HF (or PEFT adapter) directory."""
        if self.acc.is_main_process:
            save_pretrained_weights(self.unwrap(model), tokenizer, out_dir)

    def close(self) -> None:
        pass


class Sharded(Replicated):
    """FSDP2 (`fully_shard`) on one mesh of every process (see the module docstring)."""

    name = "fsdp"
    cpu_share_prompts = "always"
    collective_forward = True

    def __init__(self, accelerator, config: ParallelConfig):
        super().__init__(accelerator)
        from torch.distributed.device_mesh import init_device_mesh

        self.reshard = config.reshard_after_forward
        self.precision = accelerator.mixed_precision  # what the trainer autocasts to: bf16|fp16|no
        self.own_group = not dist.is_initialized()
        if self.own_group:  # started alone: a one-process group on this device
            backend = "nccl" if accelerator.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        world = dist.get_world_size()
        if getattr(config, "hsdp", False):  # shard within a node, replicate across nodes
            nodes = int(getattr(config, "nodes", 1) or 1)
            if world % nodes:
                raise ValueError(f"hsdp: {world} processes do not split into {nodes} nodes")
            self.mesh = init_device_mesh(
                accelerator.device.type, (nodes, world // nodes), mesh_dim_names=HSDP_DIMS
            )
        else:
            self.mesh = init_device_mesh(accelerator.device.type, (world,))

    # ---- wrapping ----------------------------------------------------------------------------
    def wrap(self, model: nn.Module) -> nn.Module:
        self._fit_layout(model)
        shard(model, self.mesh, self.reshard, self.precision)
        return model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer):
        return optimizer

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model  # fully_shard works in place

    @contextmanager
    def accumulate(self, model: nn.Module, sync: bool) -> Iterator[None]:
        """A micro-step's forwards and backward. With a shared prefix every layer runs twice
        per forward; each call re-gathers its weights in backward (trainer.logps makes sure the
        prefix call's output gets a gradient, which is FSDP's signal) and reduce-scatters its
        share of the gradient, summed into the same shard."""
        if sync:
            yield
            return
        model.set_requires_gradient_sync(False)  # accumulate unsharded; reduce-scatter once
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def clip_grad_norm_(self, params: list[Tensor], max_norm: float) -> Tensor:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)  # DTensor grads: a global norm
        return _full(norm)

    # ---- checkpoints -------------------------------------------------------------------------
    # ---- format 1 checkpoints (trainer.checkpoint._load_v1) -------------------------------
    def load_trainable_state(self, model: nn.Module, state: dict[str, Tensor]) -> None:
        keys = _checkpoint_keys(model)
        missing, unexpected = set(keys.values()) - state.keys(), state.keys() - set(keys.values())
        if missing or unexpected:
            raise ValueError(
                f"state dict does not match the model: missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}"
            )
        params = model.state_dict(keep_vars=True)
        with torch.no_grad():
            for module_key, key in keys.items():
                _set_full(params[module_key], state[key])

    def load_optimizer(self, optimizer, directory: Path) -> None:
        from torch.distributed.tensor import DTensor

        state = load_state(directory / f"optimizer-rank-{self.acc.process_index}.pt")
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for i, s in state["state"].items():
            p = params[i]
            for k, v in s.items():
                if _is_dtensor(p) and v.dim() > 0:  # the moments; `step` stays a plain scalar
                    s[k] = DTensor.from_local(
                        v.to(p.device),
                        p.device_mesh,
                        p.placements,
                        run_check=False,
                        shape=p.shape,
                        stride=p.stride(),
                    )
        optimizer.load_state_dict(state)

    # ---- reference and export ------------------------------------------------------------------
    def frozen_copy(self, model: nn.Module) -> nn.Module:
        """FSDP modules cannot be deep-copied: build the same architecture on the meta device,
        shard it the same way, and copy this rank's shards (and the buffers) into it."""
        # fully_shard made the module's class a subclass of (FSDPModule, its own class)
        base: type[nn.Module] = next(
            c for c in type(model).__mro__ if not issubclass(c, _fsdp_module())
        )
        with torch.device("meta"):
            clone = base(model.config)
        clone.eval().requires_grad_(False)
        shard(clone, self.mesh, self.reshard, self.precision)
        clone.to_empty(device=self.acc.device)
        with torch.no_grad():
            for (name, src), (other, dst) in zip(
                model.named_parameters(), clone.named_parameters(), strict=True
            ):
                assert name == other and src.dtype == dst.dtype, (name, other)
                _local(dst).copy_(_local(src))
            for (_, src), (_, dst) in zip(
                model.named_buffers(), clone.named_buffers(), strict=True
            ):
                dst.copy_(src)
        return clone

    def export(self, model: nn.Module, tokenizer, out_dir) -> None:
        """Full weights: each tensor gathered in turn and kept by one owner rank, which writes
        its share as one file of a sharded safetensors export (no rank holds the model). An
        adapter (small) is gathered for rank 0 to write as peft does."""
        if not isinstance(model, PeftModel):
            write_sharded_export(model, tokenizer, Path(out_dir), self.acc)
            return
        keys = _checkpoint_keys(model)
        full = self._gather(model, keys)
        if full is not None:
            save_pretrained_weights(model, tokenizer, out_dir, state_dict=full)

    def close(self) -> None:
        release_sharding_cache()
        if self.own_group and dist.is_initialized():
            dist.destroy_process_group()

    def _gather(self, model: nn.Module, keys: dict[str, str]) -> dict[str, Tensor] | None:
        """Rank 0: {module key: full CPU tensor} for `keys`; every rank joins each all-gather."""
        params = model.state_dict(keep_vars=True)
        main = self.acc.is_main_process
        out = {}
        for module_key in keys:
            full = _full(params[module_key].detach())
            if main:
                out[module_key] = full.to("cpu", copy=True)
        return out if main else None


def return_freed_memory(threshold: int = 64 * 1024) -> None:
    """CPU training: let glibc serve every allocation above `threshold` bytes with its own
    mmap, returned to the system when freed. By default glibc raises that threshold each time
    a large block is freed (up to 32 MiB), after which per-layer buffers come from the heap
    and their freed pages stay in the process: measured on SmolLM2's shape with 2 processes,
    peak RSS per process fell from 4.0 to 3.1 GB (DDP) and from 3.6 GB and growing every
    step to a flat 2.4 GB (FSDP, which gathers and frees every layer each step). A no-op
    where the C library is not glibc."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, threshold)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def release_sharding_cache() -> None:
    """Drop this thread's DTensor sharding-propagation cache. Its entries hold the device mesh,
    so the process group outlives its run; a process forked later from another thread (a
    worker's launch with a preexec_fn) frees this thread's state in the child, runs gloo's
    destructor there, joins threads the child does not have, and dies of SIGSEGV before exec
    (seen when an FSDP run had trained earlier in the same process: the test suite)."""
    clear = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear is not None:
        clear()


def make_parallel(config: ParallelConfig, accelerator) -> Replicated:
    """The one place the strategy is chosen."""
    return Sharded(accelerator, config) if config.fsdp else Replicated(accelerator)


def shard(model: nn.Module, mesh, reshard_after_forward: bool, precision: str = "no") -> None:
    """fully_shard every decoder layer, then the root (embeddings, final norm, the head).

    `precision` "bf16" (the spec's precision, as accelerate's `mixed_precision` names it):
    FSDP2's MixedPrecisionPolicy all-gathers the weights in bf16, so each weight is cast once
    per gather instead of by autocast in every op that reads it, and reduce-scatters (and
    accumulates, without sync) the gradients in fp32; the sharded fp32 master weights and
    AdamW are unchanged. Norm weights are bf16 too (under autocast alone they stay fp32), a
    bf16-rounding difference from DDP. It also gives LoRA's mixed layers (bf16 base, fp32
    adapter) the one all-gather dtype FSDP2 requires. Other precisions: weights as stored.

    Activation checkpointing (trainer.modeling.set_activation_checkpointing) and compile
    (trainer.modeling.compile_layers) are set on the layers before this, as torch's FSDP2
    recipe (torchtitan) orders them.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if precision == "bf16"
        else MixedPrecisionPolicy()
    )
    kw = {"mesh": mesh, "reshard_after_forward": reshard_after_forward, "mp_policy": mp}
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    layer_types = set(getattr(base, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if type(module).__name__ in layer_types:
            fully_shard(module, **kw)
    fully_shard(model, **kw)


# ---- helpers ------------------------------------------------------------------------------------


def _fsdp_module() -> type:
    from torch.distributed.fsdp import FSDPModule

    return FSDPModule


def _set_full(param: Tensor, full: Tensor) -> None:
    """Copy a full tensor into a (sharded) parameter in place; every rank holds `full`."""
    full = full.to(device=param.device, dtype=param.dtype)
    if _is_dtensor(param):
        from torch.distributed.tensor import distribute_tensor

        # src_data_rank=None: every rank slices its own shard, no communication
        shard_ = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        _local(param).copy_(shard_.to_local())
    else:
        param.copy_(full)
