"""Sampling from an FSDP2-sharded policy: its weights gathered whole, one tensor at a time.

Under FSDP2 (trainer.distributed) every parameter is a DTensor holding 1/N of its rows, and a
forward is collective (each layer all-gathers its weights). Ranks decode prompts of different
lengths for a different number of steps, so generating on the sharded policy would deadlock.
Each rank samples from whole weights instead:

* ``full_weights`` streams (name, full tensor) pairs, one ``DTensor.full_tensor()`` per
  parameter, as verl's layered DTensor loader and TRL's FSDP2 vLLM sync do: the caller (vLLM's
  loader) copies each into its engine and drops it before the next is gathered, so the extra
  memory is one parameter, never the whole model (and never its gradients or AdamW state).
* ``unsharded_copy`` (the transformers engine) builds the policy's architecture on the meta
  device, peft adapter included, and puts each gathered tensor in its place: a plain module
  with exactly the policy's weights, which decodes without collectives. A LoRA policy's base is
  gathered each round along with its adapter: keeping it would hold a whole unsharded base per
  rank through training, the memory FSDP was chosen to save, to spare one all-gather per layer
  per round (the traffic of a single training forward, next to hundreds of decoded tokens).

Both are collectives: every rank must gather the same names in the same order (the round
does: every rank refreshes its sampler at the round's start), and only the local decoding
differs per rank.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from trainer.dtensors import _checkpoint_keys, _full, _is_dtensor, _unique_keys


def is_sharded(module: nn.Module) -> bool:
    """Whether `module` holds FSDP2 shards (DTensor parameters)."""
    return any(_is_dtensor(p) for p in module.parameters())


def full_weights(module: nn.Module, keys: list[str] | None = None) -> Iterator[tuple[str, Tensor]]:
    """(state-dict key, whole tensor) for `keys` (default: every weight once, tied aliases
    skipped), gathered lazily, one at a time: a tensor is only gathered when the consumer asks
    for it, so a consumer that drops each one holds a single parameter's worth at a time.
    Collective when `module` is sharded: every rank must exhaust the iterator."""
    params = module.state_dict(keep_vars=True)
    for key in _unique_keys(module) if keys is None else keys:
        yield key, _full(params[key].detach())


def adapter_weights(peft_model: nn.Module) -> dict[str, Tensor]:
    """A peft policy's adapter tensors, whole, under the module's state-dict keys (what
    ``PeftModel.save_pretrained(state_dict=...)`` filters and renames). Collective."""
    return dict(full_weights(peft_model, list(_checkpoint_keys(peft_model))))


def unsharded_copy(policy: nn.Module) -> nn.Module:
    """A plain module of the sharded `policy`'s architecture with its current weights, in eval
    mode, without gradients. Costs one whole copy of the weights in the policy's dtypes per
    rank, for as long as the caller keeps it. Collective (every rank calls it together)."""
    with torch.device("meta"):
        clone = _meta_clone(policy)
    clone.eval().requires_grad_(False)
    slots = _slots(clone, "_parameters")
    with torch.no_grad():
        for key, full in full_weights(policy, list(slots)):
            param = nn.Parameter(full, requires_grad=False)
            for module, leaf in slots[key]:  # a tied weight fills every place it is used
                module._parameters[leaf] = param
        # buffers (rotary frequencies) are not sharded: every rank has them whole already
        sources = dict(policy.named_buffers(remove_duplicate=False))
        for key, places in _slots(clone, "_buffers").items():
            for module, leaf in places:
                module._buffers[leaf] = sources[key].detach().clone()
    return clone


def _meta_clone(policy: nn.Module) -> nn.Module:
    """The policy's architecture (and adapter), built under the meta device: no memory."""
    from peft import PeftModel, get_peft_model

    inner = policy.get_base_model() if isinstance(policy, PeftModel) else policy
    clone = _plain_class(inner)(copy.deepcopy(inner.config))
    clone.generation_config = copy.deepcopy(inner.generation_config)  # its stop tokens
    if isinstance(policy, PeftModel):
        (name, config), *more = policy.peft_config.items()
        if more:
            raise ValueError("sampling from a sharded policy supports one adapter")
        clone = get_peft_model(clone, copy.deepcopy(config), adapter_name=name)
    return clone


def _plain_class(module: nn.Module) -> type[nn.Module]:
    """The module's own class: fully_shard made it a subclass of (FSDPModule, that class)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(module).__mro__ if not issubclass(c, FSDPModule))


def _slots(module: nn.Module, kind: str) -> dict[str, list[tuple[nn.Module, str]]]:
    """{first name of each tensor: every (module, attribute) that holds it}: tied weights
    (lm_head and embed_tokens) are one tensor under two names."""
    first: dict[int, str] = {}
    out: dict[str, list[tuple[nn.Module, str]]] = {}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for leaf, tensor in getattr(sub, kind).items():
            if tensor is None:
                continue
            key = first.setdefault(id(tensor), f"{prefix}.{leaf}" if prefix else leaf)
            out.setdefault(key, []).append((sub, leaf))
    return out
