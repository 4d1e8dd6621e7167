"""DTensor helpers shared by the sharded strategy (trainer.distributed) and the samplers that
gather a sharded policy (trainer.sampling.gathered): torch and peft only, so neither imports
the other."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from peft import PeftModel
from peft.utils import get_peft_model_state_dict
from torch import Tensor, nn


def _is_dtensor(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _full(t: Tensor) -> Tensor:
    return t.full_tensor() if _is_dtensor(t) else t


def _local(t: Tensor) -> Tensor:
    return t.to_local() if _is_dtensor(t) else t


def _unique_keys(model: nn.Module) -> list[str]:
    """State-dict keys, each tensor once (a tied head appears under its first name only)."""
    seen: set[int] = set()
    keys = []
    for key, value in model.state_dict(keep_vars=True).items():
        if id(value) not in seen:
            seen.add(id(value))
            keys.append(key)
    return keys


def _checkpoint_keys(model: nn.Module) -> dict[str, str]:
    """{module state-dict key: key in trainable_state_dict} without touching any tensor:
    the adapter's weights under peft's names, else every weight once."""
    if not isinstance(model, PeftModel):
        return {k: k for k in _unique_keys(model)}
    params = model.state_dict(keep_vars=True)
    by_id = {id(v): k for k, v in params.items()}
    return {by_id[id(v)]: k for k, v in get_peft_model_state_dict(model, state_dict=params).items()}


def _owners(sizes: list[int], world: int) -> list[int]:
    """An owner rank per tensor, the largest first to the least loaded rank: the same on every
    rank (sizes are global shapes), so each rank keeps about 1/world of the bytes."""
    load = [0] * world
    owners = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        owner = min(range(world), key=lambda r: (load[r], r))
        owners[i] = owner
        load[owner] += sizes[i]
    return owners


def write_sharded_export(model: nn.Module, tokenizer, out_dir: Path, acc) -> None:
    """A plain HF directory of `model`'s full weights (a sharded FSDP model) written without
    gathering the model on one rank: every tensor is gathered in turn (a collective), kept
    only by its owner rank (`_owners`), and each rank writes its tensors as one file of a
    sharded safetensors checkpoint (`model-0000R-of-0000N.safetensors`; one process: one
    `model.safetensors`); rank 0 writes the index (`model.safetensors.index.json`), the config
    and the tokenizer. Written under a
    sibling `.NAME.tmp` and renamed by each node's first process once every rank is done
    (as trainer.modeling.save_pretrained_weights: `out_dir` must not hold files). Collective."""
    import torch.distributed as dist
    from safetensors.torch import save_file

    from trainer.modeling.policy import _inference_config

    out_dir = Path(out_dir)
    rank, world = dist.get_rank(), dist.get_world_size()
    if out_dir.exists() and any(out_dir.iterdir()):  # every rank that sees it: none waits
        raise FileExistsError(f"{out_dir} already exists and is not empty")
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    if acc.is_local_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    acc.wait_for_everyone()
    params = model.state_dict(keep_vars=True)
    keys = _unique_keys(model)  # a tied head is saved once, as save_pretrained does
    owners = _owners([params[k].numel() * params[k].element_size() for k in keys], world)
    used = sorted(set(owners))
    files = {r: f"model-{i + 1:05d}-of-{len(used):05d}.safetensors" for i, r in enumerate(used)}
    if len(used) == 1:  # one process: one file, as save_pretrained writes a small model
        files = {used[0]: "model.safetensors"}
    mine: dict[str, Tensor] = {}
    for key, owner in zip(keys, owners, strict=True):
        full = _full(params[key].detach())  # every rank joins each gather
        if owner == rank:
            mine[key] = full.to("cpu", copy=True).contiguous()
        del full
    if mine:
        save_file(mine, tmp / files[rank], metadata={"format": "pt"})
    del mine
    if rank == 0 and len(used) > 1:
        total = sum(params[k].numel() * params[k].element_size() for k in keys)
        index = {
            "metadata": {"total_size": total},
            "weight_map": {k: files[o] for k, o in zip(keys, owners, strict=True)},
        }
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    if rank == 0:
        with _inference_config(model):
            model.config.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    acc.wait_for_everyone()
    if acc.is_local_main_process:
        if out_dir.exists():
            out_dir.rmdir()
        os.rename(tmp, out_dir)
    acc.wait_for_everyone()
