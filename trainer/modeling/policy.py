"""Load a resolved model directory as tokenizer + trainable policy, and move its weights around.

The policy is deterministic by construction: every model dropout is zeroed, so ``train()`` and
``eval()`` compute the same function and log-ratios against the reference are exact (only an
explicit ``adapter.dropout`` adds noise). The KV cache is off (training never decodes) and
activation checkpointing is off after loading; the trainer turns it on per job with
:func:`set_activation_checkpointing`. LoRA wraps the model with peft, so the reference of a
LoRA job is the same module with the adapter disabled, not a second copy.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from contract.spec import AdapterConfig, JobSpec

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}

# Used only for a local model that ships none: plain ChatML, no injected system prompt.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    """Tokenizer with a pad token, right padding and a chat template, as the data code expects.

    The pad token falls back to EOS (SmolLM2 already pads with ``<|im_end|>`` = EOS), so masks
    must come from ``attention_mask``, never from ``input_ids == pad_token_id``: that would also
    mask the EOS that ends every completion.
    """
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer in {model_dir} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    if not tokenizer.chat_template:
        log.warning("%s has no chat template; using plain ChatML", model_dir)
        tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
    return tokenizer


def load_policy(spec: JobSpec, model_dir: Path) -> nn.Module:
    """The model to train, LoRA-wrapped if ``spec.adapter`` says so.

    Precision: full fine-tuning keeps fp32 master weights (the trainer autocasts the forward
    to ``spec.precision``), because pure-bf16 AdamW rounds away updates smaller than ~1/256
    of a weight. With LoRA the frozen base is stored in ``spec.precision`` and peft keeps the
    adapter in fp32.

    LoRA's A matrices are drawn from torch's global RNG, so the caller seeds it
    (``torch.manual_seed(spec.seed)``) before calling; B starts at zero, so a fresh adapter
    leaves the model's outputs unchanged. Returned in train mode.
    """
    config = AutoConfig.from_pretrained(model_dir)
    config.use_cache = False
    _zero_config_dropout(config)
    lora = spec.adapter.kind == "lora"
    dtype = DTYPES[spec.precision] if lora else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=dtype)
    if activation_checkpointing(model):
        _disable_activation_checkpointing(model)
    _zero_dropout_modules(model)
    if lora:
        model = _wrap_lora(model, spec.adapter)
    model.train()
    return model


def activation_checkpointing(model: nn.Module) -> bool:
    """Whether ``model`` recomputes activations in backward, on every transformers we support.

    transformers 5.23 renamed gradient checkpointing to activation checkpointing; vLLM 0.32
    (the pinned sampler) caps transformers below 5.20, and the GPU hosts here carry 5.17. The
    name is looked up on the class so the deprecated property is never called where the new
    one exists. A peft model answers for its base model.
    """
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if isinstance(getattr(type(base), name, None), property):
            return bool(getattr(base, name))
    return False


def set_activation_checkpointing(model: nn.Module, on: bool) -> None:
    """Recompute each decoder layer's activations in backward (``on``), or keep them (off).

    transformers' own per-layer mechanism (``GradientCheckpointingLayer``): a layer that is in
    train mode runs its ``__call__`` inside ``torch.utils.checkpoint``, non-reentrant, so only
    the layer's input is kept and the layer's forward runs again in backward. Our policy stays
    in train mode with dropout zeroed, so the recompute gives bitwise the same activations.
    Under ``no_grad`` (the reference, the lookahead, data scoring) nothing is saved, so nothing
    is recomputed: checkpointing only costs the training forward, once more (~1/3 of a step).

    Non-reentrant checkpointing needs no input that requires grad, so the embedding hook
    transformers (and peft, for reentrant checkpointing) adds for that is removed: with LoRA
    it would only make backward compute an unused gradient for the embeddings' output.

    FSDP2: this wraps the layer's whole ``__call__``, so ``fully_shard``'s hooks run inside the
    checkpointed region; FSDP2 supports that (its pre/post-forward hooks do nothing during the
    recompute, the pre-backward hook has already gathered the weights). We use it rather than
    torch's ``checkpoint_wrapper`` because the wrapper inserts ``_checkpoint_wrapped_module.``
    into every parameter name, which our checkpoints, exports and the FSDP frozen copy (all
    keyed by ``named_parameters``/``state_dict``) would each have to strip. One mechanism for
    DDP and FSDP, names unchanged. Call it before wrapping (DDP) or sharding (FSDP2).
    """
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    names = ("activation_checkpointing", "gradient_checkpointing")  # transformers 5.23 renamed it
    name = next((n for n in names if hasattr(type(base), f"{n}_enable")), None)
    if name is None:
        if on:
            raise ValueError(f"{type(base).__name__} has no activation checkpointing")
        return
    if not on:
        getattr(base, f"{name}_disable")()
        return
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(base).__name__} does not support activation checkpointing")
    getattr(base, f"{name}_enable")({"use_reentrant": False})
    base.disable_input_require_grads()


def _disable_activation_checkpointing(model: nn.Module) -> None:
    set_activation_checkpointing(model, False)


def _zero_config_dropout(config: object) -> None:
    """Zero every ``*dropout*``/``*pdrop`` float in the config before the modules are built.

    Attention dropout in HF models is a functional call reading the config value, not an
    ``nn.Dropout`` module, so it must be zeroed here.
    """
    for key, value in list(vars(config).items()):
        if ("dropout" in key or key.endswith("pdrop")) and isinstance(value, float):
            setattr(config, key, 0.0)


def _zero_dropout_modules(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


def _wrap_lora(model: nn.Module, adapter: AdapterConfig) -> PeftModel:
    """peft marks only the adapter weights trainable and freezes the base model."""
    lora = LoraConfig(
        r=adapter.r,
        lora_alpha=adapter.alpha,
        lora_dropout=adapter.dropout,
        target_modules=list(adapter.target_modules),
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():  # peft 0.21 probes a property transformers 5 deprecated
        warnings.filterwarnings(
            "ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning
        )
        return get_peft_model(model, lora)


# --- weights in and out ----------------------------------------------------------------------


def trainable_state_dict(model: nn.Module, copy: bool = True) -> dict[str, Tensor]:
    """CPU copies of what training changes: the adapter for peft models, else every weight
    (`copy=False`: the detached tensors themselves, where they are, for a caller that copies
    them on at once: the async sampler's weight publication).

    Copies, not views: the result is used as a snapshot (checkpoint, reference sync) and must not
    follow later optimizer steps. For a full model that costs one model's worth of host memory.
    Tied weights appear once (under their first name), so safetensors can save the dict.
    """
    if isinstance(model, PeftModel):
        state = get_peft_model_state_dict(model)
    else:
        aliases = _aliases(model)
        state = {k: v for k, v in model.state_dict().items() if k not in aliases}
    if not copy:
        return {k: v.detach() for k, v in state.items()}
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def load_trainable_state_dict(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Copy ``state`` (from :func:`trainable_state_dict`) into ``model`` in place.

    In place, so optimizer references to the parameters stay valid. Strict: a missing or an
    unexpected key raises, since silently resuming with half the weights is worse than failing.
    """
    expected = set(trainable_state_dict_keys(model))
    missing, unexpected = expected - state.keys(), state.keys() - expected
    if missing or unexpected:
        raise ValueError(
            f"state dict does not match the model: missing {_few(missing)}, "
            f"unexpected {_few(unexpected)}"
        )
    if isinstance(model, PeftModel):
        set_peft_model_state_dict(model, state)
    else:
        # strict=False only forgives the tied aliases left out above; keys were checked.
        model.load_state_dict(state, strict=False)


def trainable_state_dict_keys(model: nn.Module) -> list[str]:
    """The keys :func:`trainable_state_dict` returns, without copying any tensor."""
    if isinstance(model, PeftModel):
        return list(get_peft_model_state_dict(model))
    aliases = _aliases(model)
    return [k for k in model.state_dict() if k not in aliases]


def _aliases(model: nn.Module) -> set[str]:
    """State-dict names that view the same tensor as an earlier name (e.g. a tied lm_head)."""
    seen: set[tuple[int, int, tuple[int, ...], torch.device]] = set()
    aliases: set[str] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if tensor.device.type == "meta":  # no storage to compare
            continue
        key = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tensor.shape,
            tensor.device,
        )
        if key in seen:
            aliases.add(name)
        seen.add(key)
    return aliases


def _few(keys: set[str], limit: int = 5) -> str:
    shown = sorted(keys)[:limit]
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return (", ".join(shown) or "none") + more


def save_pretrained_weights(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: Path,
    state_dict: dict[str, Tensor] | None = None,
) -> None:
    """Export the trained result so plain transformers/peft can load it, atomically.

    peft models write ``adapter_model.safetensors`` + ``adapter_config.json`` (whose
    ``base_model_name_or_path`` is the resolved base directory); full models write safetensors,
    ``config.json`` and ``generation_config.json``. The tokenizer goes alongside in both cases.
    Everything lands in a sibling temp dir renamed to ``out_dir``, which must not hold files.
    ``state_dict`` (module keys, full tensors) replaces the model's own, e.g. gathered from a
    sharded model (trainer.distributed).
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} already exists and is not empty")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        with _inference_config(model):
            model.save_pretrained(tmp, **({} if state_dict is None else {"state_dict": state_dict}))
        tokenizer.save_pretrained(tmp)
        if out_dir.exists():
            out_dir.rmdir()
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def _inference_config(model: nn.Module) -> Iterator[None]:
    """Save ``use_cache=True``: the export is for generation, only training turned the cache off."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "use_cache"):
        yield
        return
    previous = config.use_cache
    config.use_cache = True
    try:
        yield
    finally:
        config.use_cache = previous
