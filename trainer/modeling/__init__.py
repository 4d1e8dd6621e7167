"""Model and tokenizer loading for the trainer.

Two halves, one import path:

* ``sources``: turn a ``JobSpec.base_model`` string into a local Hugging Face directory. The
  built-in names are materialised once into :func:`cache_dir` (the workers have no hub access),
  atomically and under a file lock so concurrent jobs never see a half-written model.
* ``policy``: load that directory as a tokenizer and a trainable policy (full or LoRA), and move
  its trainable weights in and out for checkpoints and the final export.
* ``layers``: per-decoder-layer options set before wrapping or sharding: activation
  checkpointing and regional torch.compile (:func:`apply_model_options`).
"""

from trainer.modeling.layers import apply_model_options, compile_layers
from trainer.modeling.policy import (
    activation_checkpointing,
    load_policy,
    load_tokenizer,
    load_trainable_state_dict,
    save_pretrained_weights,
    set_activation_checkpointing,
    trainable_state_dict,
)
from trainer.modeling.sources import BUILTIN_MODELS, cache_dir, resolve_model

__all__ = [
    "BUILTIN_MODELS",
    "activation_checkpointing",
    "apply_model_options",
    "compile_layers",
    "cache_dir",
    "load_policy",
    "load_tokenizer",
    "load_trainable_state_dict",
    "resolve_model",
    "save_pretrained_weights",
    "set_activation_checkpointing",
    "trainable_state_dict",
]
