"""DTensor helpers shared by the sharded strategy (trainer.distributed) and the samplers that
gather a sharded policy (trainer.sampling.gathered): torch and peft only, so neither imports
the other."""

from __future__ import annotations

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
