"""Per-decoder-layer options the trainer sets on a loaded policy before wrapping or sharding it:
activation checkpointing (trainer.modeling.policy.set_activation_checkpointing) and regional
``torch.compile``.

Regional compilation compiles each decoder layer in place (``module.compile()``, torch's
regional-compilation recipe): the layers share one code object, so the first layer's compile
serves them all (one graph, not one per layer), parameter names stay unchanged (a
``torch.compile(module)`` wrapper would add ``_orig_mod.`` to each), and the embeddings, head
and log-probs stay eager. Done before ``fully_shard`` (torchtitan's order), whose hooks then
run around the compiled layer; with checkpointing the compiled layer is what the checkpoint
recomputes.

A compile failure never fails the job. It may surface when compile is asked for or, since
compilation is lazy, in the first forward of a layer (or the first forward of a new shape):
each layer's compiled call is wrapped so that a ``torch._dynamo`` error (inductor's, a missing
C++ compiler's, dynamo's own) switches every layer back to eager, reports a warning and
reruns the call eagerly. Other errors (out of memory included) are not compile failures and
propagate. The first call of each layer also lowers the backward graph (AOTAutograd lowers it
lazily, at the first backward, by default), so a backward that cannot compile falls back too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from peft import PeftModel
from torch import nn

from trainer.modeling.policy import set_activation_checkpointing

log = logging.getLogger(__name__)

Warn = Callable[[str], None]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks (the model's ``_no_split_modules``, as trainer.distributed shards)."""
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    types = set(getattr(base, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in types]


def compile_layers(
    model: nn.Module, on: bool, *, warn: Warn | None = None, backend: Any = "inductor"
) -> str | None:
    """Compile each decoder layer in place (``on``) or make them eager again (off).

    Returns a warning when compiling cannot even start (the layers stay eager); a failure in a
    later forward is reported through ``warn`` (default: this module's logger) and the job
    goes on eagerly. ``backend`` is torch.compile's (tests pass a failing or cheap one).
    """
    layers = decoder_layers(model)
    if not on:
        _eager(layers)
        return None
    if not layers:
        return f"compile: {type(model).__name__} has no decoder layers to compile; training eagerly"
    fallback = _Fallback(layers, warn or log.warning)
    try:
        for layer in layers:
            layer.compile(backend=backend)
            layer._compiled_call_impl = fallback.guard(layer)
    except Exception as exc:  # noqa: BLE001 - any failure to set up compile means eager
        _eager(layers)
        return f"compile failed ({_describe(exc)}); training eagerly"
    return None


def apply_model_options(
    model: nn.Module, *, checkpointing: bool, compile: bool, warn: Warn | None = None
) -> list[str]:
    """Activation checkpointing, then regional compile, on a policy from load_policy, before
    the trainer wraps (DDP) or shards (FSDP2) it. Returns warnings to log (compile's)."""
    set_activation_checkpointing(model, checkpointing)
    message = compile_layers(model, compile, warn=warn)
    return [message] if message else []


def compiled(model: nn.Module) -> bool:
    """Whether any decoder layer runs compiled (False after a fallback)."""
    return any(layer._compiled_call_impl is not None for layer in decoder_layers(model))


class _Fallback:
    """One per compile_layers call: the first compile error switches every layer to eager."""

    def __init__(self, layers: list[nn.Module], warn: Warn):
        self.layers, self.warn = layers, warn

    def guard(self, layer: nn.Module) -> Callable[..., Any]:
        """``layer``'s compiled call, falling back to its eager ``_call_impl`` (hooks and all,
        what ``nn.Module.__call__`` runs when nothing is compiled)."""
        from torch._dynamo.exc import TorchDynamoException

        compiled_call, eager_call = layer._compiled_call_impl, layer._call_impl
        assert compiled_call is not None
        first = True

        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal first
            try:
                if not first:
                    return compiled_call(*args, **kwargs)
                first = False
                with torch._functorch.config.patch(force_non_lazy_backward_lowering=True):
                    return compiled_call(*args, **kwargs)
            except TorchDynamoException as exc:
                self._to_eager(exc)
                return eager_call(*args, **kwargs)

        return call

    def _to_eager(self, exc: Exception) -> None:
        _eager(self.layers)
        self.warn(f"compile failed ({_describe(exc)}); training eagerly")


def _eager(layers: list[nn.Module]) -> None:
    for layer in layers:
        layer._compiled_call_impl = None


def _describe(exc: BaseException) -> str:
    """The error and its cause, first lines only (a backend's error is wrapped by dynamo)."""
    parts = []
    for e in (exc, getattr(exc, "inner_exception", None) or exc.__cause__):
        if e is not None:
            lines = str(e).strip().splitlines()
            parts.append(f"{type(e).__name__}: {lines[0] if lines else ''}".strip())
    return " <- ".join(parts)
