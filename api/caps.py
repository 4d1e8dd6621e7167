"""Operator caps on a job spec's resource fields (DESIGN.md §6).

The spec (contract.spec) holds only hard bounds that no deployment would raise (a step count
must fit PostgreSQL's int4); what one job may ask of this deployment's workers is the
operator's choice, read from the CAP_* settings and checked here when a job is admitted
(api.admission.admit_job, used by /v1/jobs and /v1/fine_tuning/jobs). A spec over a cap is
refused with 422 naming the field, its value and the cap.

`check_memory` refuses a job that cannot fit CAP_TRAIN_MEMORY_GIB per training process
(contract.memory, from the base model's config.json): with grad_accum unset, when not even one
example per micro-batch fits; with it set, at that grad_accum. The 422 names what to change.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path
from typing import Any

from api.errors import api_error
from contract.memory import BUILTIN_SHAPES, GiB, ModelShape
from contract.micro_batch import SAFETY_MARGIN, choose_micro_batch
from contract.spec import JobSpec
from models.settings import Settings

log = logging.getLogger("humanline.api")

# (field path as the API names it, settings attribute): one line per capped field.
CAPS: tuple[tuple[str, str], ...] = (
    ("adapter.r", "CAP_ADAPTER_R"),
    ("max_steps", "CAP_STEPS"),
    ("epochs", "CAP_EPOCHS"),
    ("max_length", "CAP_MAX_LENGTH"),
    ("max_prompt_length", "CAP_MAX_PROMPT_LENGTH"),
    ("batch_size", "CAP_BATCH_SIZE"),
    ("grad_accum", "CAP_GRAD_ACCUM"),
    ("quality_sample", "CAP_QUALITY_SAMPLE"),
    ("online.num_samples", "CAP_NUM_SAMPLES"),
    ("online.max_new_tokens", "CAP_MAX_NEW_TOKENS"),
    ("online.prompt_budget", "CAP_PROMPT_BUDGET"),
    ("online.lag", "CAP_ONLINE_LAG"),
    ("online.vllm.max_model_len", "CAP_MAX_MODEL_LEN"),
    ("online.vllm.kv_cache_gib", "CAP_KV_CACHE_GIB"),
    ("parallelism.nodes", "MAX_NODES"),
    ("parallelism.processes_per_node", "MAX_PROCESSES_PER_NODE"),
)
REWARD_TIMEOUT_OPTIONS = ("timeout_s", "start_timeout_s")


def _value(spec: Any, path: str) -> Any:
    for name in path.split("."):
        if spec is None:
            return None
        spec = getattr(spec, name)
    return spec


def _over(field: str, value: Any, cap: float) -> None:
    raise api_error(422, f"{field} {value} is above this service's cap of {cap}", field=field)


def check_caps(spec: JobSpec, settings: Settings) -> None:
    """Refuse (422, naming the field and the cap) a spec asking more than the operator allows."""
    lora = spec.adapter.kind != "none"
    for field, setting in CAPS:
        if field.startswith("adapter.") and not lora:
            continue  # a full fine-tune has no rank: the default r is never used
        value, cap = _value(spec, field), getattr(settings, setting)
        if value is not None and value > cap:
            _over(field, value, cap)
    if spec.parallelism.nodes > 1 and settings.MULTINODE_LAUNCHER == "none":
        raise api_error(
            422,
            f"parallelism.nodes {spec.parallelism.nodes}: this service runs a job on one node "
            "only (no multi-node launcher: MULTINODE_LAUNCHER is 'none')",
            field="parallelism.nodes",
        )
    _check_async(spec, settings)
    modules = spec.adapter.target_modules
    if lora and len(modules) > settings.CAP_TARGET_MODULES:
        _over("adapter.target_modules", f"({len(modules)} entries)", settings.CAP_TARGET_MODULES)
    for i, reward in enumerate(spec.online.rewards if spec.online else []):
        for option in REWARD_TIMEOUT_OPTIONS:
            if option not in reward.options:
                continue
            value, field = reward.options[option], f"online.rewards.{i}.options.{option}"
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise api_error(422, f"{field} must be a positive number of seconds", field=field)
            if value > settings.CAP_REWARD_TIMEOUT_SECONDS:
                _over(field, value, settings.CAP_REWARD_TIMEOUT_SECONDS)


def check_total_steps(steps: int, spec: JobSpec, settings: Settings) -> None:
    """The steps a job will run (epochs × batches when max_steps is unset) within CAP_STEPS."""
    if steps > settings.CAP_STEPS:
        field = "max_steps" if spec.max_steps is not None else "epochs"
        raise api_error(
            422,
            f"the job would run {steps} steps, above this service's cap of {settings.CAP_STEPS}; "
            f"lower {field}",
            field=field,
        )


def check_max_runtime(spec: JobSpec, settings: Settings) -> float:
    """The job's wall-clock limit: the spec's (a user may lower it, or raise it up to the
    cap, never past: 422), else the operator's default."""
    cap = settings.CAP_MAX_RUNTIME_SECONDS
    if spec.max_runtime is not None and spec.max_runtime > cap:
        _over("max_runtime", spec.max_runtime, cap)
    return settings.max_runtime(spec.max_runtime)


# --- memory (CAP_TRAIN_MEMORY_GIB) ------------------------------------------------------------
# What to change, for the part of the estimate that is largest. With grad_accum unset the
# trainer already splits the batch down to one example per micro-batch (and checkpoints the
# layers), so a refused job's batch parts name what one example costs: its length, the model.
ADVICE = {
    "weights": "a smaller base model, a LoRA adapter, or precision bf16 with LoRA",
    "gradients and optimizer": "a LoRA adapter (or a smaller adapter.r)",
    "reference": "a LoRA adapter, or reference_sync humanline (no frozen copy)",
    "activations": "lower max_length, a smaller base_model, a LoRA adapter or precision bf16",
    "logits": "lower max_length or a smaller base_model",
    "sampler": "lower online.num_samples, online.max_new_tokens or online.vllm.kv_cache_gib",
    "training data": "a smaller training file",
}
# A grad_accum the user set is used as given, so raising it stays theirs to do.
ADVICE_SET_ACCUM = {
    "activations": "lower batch_size or max_length, raise grad_accum (or leave it unset: the "
    "trainer picks the micro-batch), or activation_checkpointing on",
    "logits": "lower batch_size or max_length, or raise grad_accum (or leave it unset)",
}
BATCH_FIELDS = ("batch_size", "grad_accum")


def model_shape(base_model: str) -> ModelShape | None:
    """The base model's shape: a built-in's (contract.memory.BUILTIN_SHAPES), else the
    config.json of the allowed model directory when this API process can read it."""
    if base_model in BUILTIN_SHAPES:
        return BUILTIN_SHAPES[base_model]
    path = Path(base_model).expanduser()
    try:
        return _shape_of(str(path), (path / "config.json").stat().st_mtime_ns)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


@lru_cache(maxsize=64)
def _shape_of(model_dir: str, mtime_ns: int) -> ModelShape:
    return ModelShape.from_model_dir(model_dir)


def check_memory(
    spec: JobSpec, settings: Settings, training_file_bytes: int = 0, training_records: int = 0
) -> str:
    """Refuse (422) a job that cannot fit CAP_TRAIN_MEMORY_GIB per training process, naming
    the fields that drive the estimate, the estimate and the cap. With grad_accum unset that
    is a job whose smallest micro-batch (one example, checkpointed unless the spec says off:
    contract.micro_batch.choose_micro_batch, what the trainer will do) does not fit; a set
    grad_accum is priced as given. Returns a warning ("" when none) when the base model's
    config.json cannot be read here (a model directory mounted on the workers only): that
    job is admitted unestimated."""
    shape = model_shape(spec.base_model)
    if shape is None:
        log.warning("no config.json readable for %s: memory not estimated", spec.base_model)
        return (
            f"the memory of base_model {spec.base_model!r} was not estimated: its config.json "
            "is not readable by the API"
        )
    cap = settings.CAP_TRAIN_MEMORY_GIB
    try:
        choice = choose_micro_batch(
            spec,
            shape,
            int(cap * GiB),
            training_file_bytes=training_file_bytes,
            training_records=training_records,
        )
    except ValueError as e:  # the batch does not split into grad_accum micro-batches
        raise api_error(422, str(e), field="grad_accum") from e
    if choice.fits:
        return ""
    estimate = choice.estimate
    parts = estimate.largest()
    chosen = spec.grad_accum is None
    drivers = [f for f in estimate.drivers() if not (chosen and f in BATCH_FIELDS)]
    advice = ADVICE if chosen else {**ADVICE, **ADVICE_SET_ACCUM}
    smallest = (
        "even one example per micro-batch"
        + (" with activation checkpointing" if choice.activation_checkpointing else "")
        if chosen
        else f"at grad_accum {spec.grad_accum}"
    )
    shown = ", ".join(f"{name} {size / GiB:.1f} GiB" for name, size in parts[:4])
    raise api_error(
        422,
        f"the job would need about {estimate.gib:.1f} GiB of memory per training process "
        f"{smallest} (estimated from {spec.base_model}'s size and {', '.join(drivers[:6])}), "
        f"above this service's cap of {cap:g} GiB less a {SAFETY_MARGIN:.0%} margin: {shown}; "
        f"{advice[parts[0][0]]}",
        field=drivers[0],
        errors=[
            {
                "field": next((f for f in estimate.fields.get(name, ()) if f in drivers), None),
                "message": f"{name}: {size / GiB:.2f} GiB",
                "part": name,
                "bytes": size,
                "fields": [f for f in estimate.fields.get(name, ()) if f in drivers],
            }
            for name, size in parts
        ],
    )


def _check_async(spec: JobSpec, settings: Settings) -> None:
    """An async online job needs a worker that can place its sampler process beside the
    trainer (contract.online_async)."""
    if spec.online is None or not spec.online.is_async:
        return
    if not settings.ONLINE_ASYNC:
        raise api_error(
            422,
            "online.mode 'async': this service cannot place a sampler process beside the "
            "trainer (ONLINE_ASYNC is off); use mode 'sync'",
            field="online.mode",
        )
