"""OpenAI's fine-tuning shapes over our jobs: one implementation, two shapes.

`POST /v1/fine_tuning/jobs` takes OpenAI's body and maps it onto a `JobSpec` (then the very
same admission, rows and workers as `POST /v1/jobs`); every read maps our rows back onto
OpenAI's objects. Only the mapping lives here: no SQL, no HTTP.

- `method.type = "dpo"`: our offline DPO; `beta`, `batch_size`, `n_epochs` and
  `learning_rate_multiplier` (× our DPO learning rate) map one to one.
- `method.type = "reinforcement"`: our online GRPO, when the grader is a `string_check` whose
  templates read `{{sample.output_text}}` and `{{item.<field>}}` (our registered
  `string_check` reward renders them per sample). A grader that needs code or an outside
  model (python, score_model, label_model, text_similarity, multi) is a 400 naming its type.
- `method.type = "supervised"`, and a job with no `method` (OpenAI's default): our SFT
  (objective `sft`, offline); `batch_size`, `n_epochs` and `learning_rate_multiplier` (× our
  SFT learning rate) map one to one, also from OpenAI's deprecated top-level
  `hyperparameters`. The file is OpenAI's chat format (contract.sft_data).
- Our extensions travel in the body beside OpenAI's fields (the `openai` package sends them
  with `extra_body=`): `humanline` (`true`, or the humanline parameters, e.g.
  `{"sync_every": 4, "log_eps_P": -1.5, "log_eps_R": 1.5}`) and `spec` (any other `JobSpec`
  field, e.g. `{"max_steps": 200, "adapter": {"kind": "lora"}}`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi import HTTPException
from pydantic import ConfigDict, Field

from api.errors import api_error
from api.schemas import unix_seconds
from contract.rewards import string_check_templates
from contract.spec import DPOConfig, GRPOConfig, HumanlineParams, OnlineConfig, SFTConfig
from contract.strict import StrictNumbers
from models.jobs import exported_model
from models.tables import Checkpoint, Job, JobEvent

STATUSES = {  # ours → OpenAI's
    "validating": "validating_files",
    "queued": "queued",
    "running": "running",
    "cancelling": "running",
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "cancelled",
}
_ITEM_FIELD = re.compile(r"^\{\{\s*item\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}$")
_SAMPLE_TEXT = re.compile(r"^\{\{\s*sample\.output_text\s*\}\}$")
Auto = Literal["auto"]


class _Open(StrictNumbers):  # no Infinity/NaN, no `true` for an integer (issue 37)
    model_config = ConfigDict(extra="allow")  # OpenAI adds fields; unknown ones are ignored


PositiveInt = Annotated[int, Field(ge=1)]
PositiveFloat = Annotated[float, Field(gt=0)]


class Hyperparameters(_Open):
    batch_size: Auto | PositiveInt | None = None
    learning_rate_multiplier: Auto | PositiveFloat | None = None
    n_epochs: Auto | PositiveInt | None = None
    beta: Auto | PositiveFloat | None = None  # dpo
    compute_multiplier: Auto | float | None = None  # reinforcement: unsupported unless auto
    eval_interval: Auto | int | None = None
    eval_samples: Auto | int | None = None
    reasoning_effort: str | None = None


class MethodBody(_Open):
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    grader: dict[str, Any] | None = None


class Method(_Open):
    type: Literal["supervised", "dpo", "reinforcement"]
    dpo: MethodBody | None = None
    reinforcement: MethodBody | None = None
    supervised: MethodBody | None = None


class FineTuningJobCreate(StrictNumbers):
    """OpenAI's `fine_tuning.jobs.create` body, plus our `humanline` and `spec` extensions."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., min_length=1)
    training_file: str = Field(..., min_length=1, max_length=64)
    method: Method | None = None
    hyperparameters: Hyperparameters | None = None  # OpenAI's deprecated supervised form
    seed: int | None = None
    suffix: str | None = Field(None, max_length=64)
    metadata: dict[str, str] | None = None
    validation_file: str | None = None
    integrations: list[dict[str, Any]] | None = None
    humanline: bool | HumanlineParams | None = None
    spec: dict[str, Any] = Field(default_factory=dict)


def _given(value: Any) -> bool:
    return value is not None and value != "auto"


def _bad(message: str, param: str) -> HTTPException:
    return api_error(400, message, field=param)


# OpenAI's other graders, and why none runs here.
_REFUSED_GRADERS = {
    "python": "it runs user code, which never runs in a worker",
    "score_model": "it needs an outside model",
    "label_model": "it needs an outside model",
    "endpoint": "it calls an outside endpoint",
    "multi": "it combines graders with a user formula",
    "text_similarity": "its metrics are not implemented",
}


def _reinforcement_reward(grader: dict[str, Any] | None) -> dict[str, Any]:
    """OpenAI's grader → our registered reward (only `string_check` has a twin). Its
    templates (`input`, `reference`) read `{{sample.output_text}}` and `{{item.<field>}}`;
    the trainer renders them for every sample (contract.graders)."""
    param = "method.reinforcement.grader"
    if not grader:
        raise _bad("reinforcement needs a grader", param)
    kind = grader.get("type")
    if kind != "string_check":
        why = _REFUSED_GRADERS.get(str(kind), "it is not one of OpenAI's graders")
        raise _bad(
            f"grader type {kind!r} is not supported ({why}): graders run only as registered "
            "rewards, and the one OpenAI grader we implement is string_check (eq, ne, like, "
            "ilike) of templates reading '{{sample.output_text}}' and '{{item.<field>}}'",
            param,
        )
    operation = grader.get("operation", "eq")
    if operation not in ("eq", "ne", "like", "ilike"):
        raise _bad(f"unknown string_check operation {operation!r}", f"{param}.operation")
    input_, reference = grader.get("input"), grader.get("reference")
    for name, value in (("input", input_), ("reference", reference)):
        if not isinstance(value, str):
            raise _bad(f"string_check needs '{name}', a template string", f"{param}.{name}")
    field = _ITEM_FIELD.match(str(reference))
    if _SAMPLE_TEXT.match(str(input_)) and field is not None:  # the usual grader
        options: dict[str, Any] = {"operation": operation, "field": field.group(1)}
    else:
        options = {"operation": operation, "input": input_, "reference": reference}
    try:
        string_check_templates(options)
    except ValueError as exc:
        raise _bad(f"string_check: {exc}", param) from None
    return {"name": "string_check", "weight": 1.0, "options": options}


def _supervised(hp: Hyperparameters) -> dict[str, Any]:
    """OpenAI's supervised method → our SFT objective (beta belongs to DPO)."""
    if _given(hp.beta):
        raise _bad("beta is a dpo hyperparameter", "method.supervised.hyperparameters.beta")
    return {"name": "sft"}


def _positive_int(spec: dict[str, Any], section: str, key: str) -> int | None:
    """`spec[section][key]` when it is a positive int (not a bool), else None: the user's
    value is not validated yet, and whatever is wrong with it is JobSpec's to refuse (a 400
    naming the field), never a crash here."""
    part = spec.get(section)
    value = part.get(key) if isinstance(part, dict) else None
    return value if type(value) is int and value > 0 else None


def spec_of(body: FineTuningJobCreate, records: int = 0) -> dict[str, Any]:
    """The JobSpec (as a dict, validated by the caller) an OpenAI create body asks for.

    `records` is the training file's line count: a reinforcement job (online, so its steps
    are not set by a file pass) gets `n_epochs` passes over its prompts unless
    `spec.max_steps` says otherwise."""
    if body.integrations:
        raise _bad("integrations are not supported", "integrations")
    if body.validation_file:
        raise _bad(
            "validation files are not used; evaluate with spec.evaluations instead",
            "validation_file",
        )
    method = body.method or Method(type="supervised")  # OpenAI's default method
    settings = getattr(method, method.type) or MethodBody()
    if body.method is None and body.hyperparameters is not None:  # the deprecated form
        settings = MethodBody(hyperparameters=body.hyperparameters)
    hp = settings.hyperparameters
    mapped: dict[str, Any] = {"base_model": body.model, "training_file": body.training_file}
    objective: dict[str, Any]
    if method.type == "supervised":
        objective, default_lr = _supervised(hp), SFTConfig.default_lr
    elif method.type == "dpo":
        objective = {"name": "dpo"}
        if _given(hp.beta):
            objective["beta"] = hp.beta
        default_lr = DPOConfig.default_lr
    else:
        for name in ("compute_multiplier", "eval_interval", "eval_samples"):
            if _given(getattr(hp, name)):
                raise _bad(
                    f"{name} is not supported", f"method.reinforcement.hyperparameters.{name}"
                )
        objective = {"name": "grpo"}
        mapped["data_source"] = "online"
        mapped["online"] = {"rewards": [_reinforcement_reward(settings.grader)]}
        default_lr = GRPOConfig.default_lr
    mapped["objective"] = objective
    if _given(hp.batch_size):
        mapped["batch_size"] = hp.batch_size
    if _given(hp.n_epochs):
        mapped["epochs"] = hp.n_epochs
    if _given(hp.learning_rate_multiplier):
        mapped["optim"] = {"lr": default_lr * float(hp.learning_rate_multiplier)}  # type: ignore[arg-type]
    if body.seed is not None:
        mapped["seed"] = body.seed
    metadata = dict(body.metadata or {})
    if body.suffix:
        metadata["suffix"] = body.suffix  # named in the fine-tuned model's id
    if metadata:
        mapped["metadata"] = metadata
    if body.humanline is not None:
        mapped["humanline"] = bool(body.humanline)
        if isinstance(body.humanline, HumanlineParams):
            mapped["humanline_params"] = body.humanline.model_dump(exclude_unset=True)
    if method.type == "reinforcement" and "max_steps" not in body.spec:
        # batch_size counts sequences (groups of num_samples): prompts per step is their ratio
        group = _positive_int(body.spec, "online", "num_samples") or OnlineConfig.model_fields[
            "num_samples"
        ].default
        batch = int(mapped.get("batch_size") or GRPOConfig.default_batch_size)
        prompts_per_step = max(1, batch // int(group))
        epochs = int(mapped.get("epochs", 1))
        mapped["max_steps"] = max(1, epochs * -(-records // prompts_per_step))
    merged = dict(body.spec)
    for key, value in mapped.items():
        given = merged.get(key)
        if key not in merged:
            merged[key] = value
        elif (
            isinstance(given, dict) and isinstance(value, dict) and not given.keys() & value.keys()
        ):
            merged[key] = {**given, **value}  # e.g. spec.online.num_samples + the grader's rewards
        elif isinstance(value, dict) and not isinstance(given, (dict, type(None))):
            continue  # spec.online: "x" is no section to merge into: JobSpec refuses it by name
        else:
            raise _bad(f"set {key} once: in OpenAI's fields or in spec, not both", "spec")
    return merged


# --- our rows → OpenAI's objects ----------------------------------------------------------


def fine_tuned_model(job: Job) -> str:
    """`ft:{base}:{team}:{suffix}:{job id}`, OpenAI's layout; the job id comes last."""
    suffix = (job.meta or {}).get("suffix", "")
    return f"ft:{job.base_model}:{job.team_id}:{suffix}:{job.id}"


def job_id_of_model(model_id: str) -> str | None:
    return model_id.rsplit(":", 1)[-1] if model_id.startswith("ft:") else None


def _when(value) -> int | None:
    return unix_seconds(value) if value is not None else None


def _method(spec: dict[str, Any]) -> dict[str, Any]:
    objective = spec.get("objective", {})
    hyper = {"batch_size": spec.get("batch_size") or "auto", "n_epochs": spec.get("epochs", 1)}
    if objective.get("name") == "grpo" and spec.get("data_source") == "online":
        rewards = (spec.get("online") or {}).get("rewards", [])
        grader = next((r for r in rewards if r.get("name") == "string_check"), None)
        body: dict[str, Any] = {"hyperparameters": hyper}
        if grader is not None:
            options = grader.get("options", {})
            field = str(options.get("field", "answer"))
            body["grader"] = {
                "type": "string_check",
                "name": "string_check",
                "input": options.get("input", "{{sample.output_text}}"),
                "reference": options.get("reference", "{{item." + field + "}}"),
                "operation": options.get("operation", "eq"),
            }
        return {"type": "reinforcement", "reinforcement": body}
    if objective.get("name") == "sft":
        return {"type": "supervised", "supervised": {"hyperparameters": hyper}}
    if "beta" in objective:
        hyper["beta"] = objective["beta"]
    return {"type": "dpo", "dpo": {"hyperparameters": hyper}}


def job_object(job: Job) -> dict[str, Any]:
    """Our job row as OpenAI's `fine_tuning.job` (plus our `humanline` and `objective`)."""
    spec = job.spec or {}
    error = None
    if job.status == "failed":
        err = job.error or {}
        error = {
            "code": str(err.get("type") or "training_failed"),
            "message": str(err.get("message") or "the job failed"),
            "param": None,
        }
    method = _method(spec)
    return {
        "id": job.id,
        "object": "fine_tuning.job",
        "created_at": unix_seconds(job.created_at),
        "finished_at": _when(job.finished_at),
        "model": job.base_model,
        "fine_tuned_model": fine_tuned_model(job) if exported_model(job) is not None else None,
        "organization_id": job.team_id,
        "result_files": [],
        "seed": int(spec.get("seed", 0)),
        "status": STATUSES[job.status],
        "trained_tokens": (job.result or {}).get("tokens_trained"),
        "training_file": spec.get("training_file", ""),
        "validation_file": None,
        "hyperparameters": method[method["type"]]["hyperparameters"],
        "method": method,
        "metadata": job.meta or None,
        "error": error,
        "estimated_finish": None,
        "integrations": None,
        "humanline": bool(spec.get("humanline")),
        "objective": (spec.get("objective") or {}).get("name"),
    }


def _level(event: JobEvent) -> str:
    """OpenAI's level of one of our events: a failure is a `status` event whose data says
    the job moved to failed (models.jobs.transition), `max_runtime_exceeded` goes with one
    (worker.runner), and warnings are `warning` events (trainer, worker)."""
    data = event.data if isinstance(event.data, dict) else {}
    if (event.kind == "status" and data.get("to") == "failed") or (
        event.kind == "max_runtime_exceeded"
    ):
        return "error"
    return "warn" if event.kind == "warning" else "info"


def event_object(event: JobEvent) -> dict[str, Any]:
    return {
        "id": f"ftevent-{event.job_id}-{event.seq}",
        "object": "fine_tuning.job.event",
        "created_at": unix_seconds(event.created_at),
        "level": _level(event),
        "message": event.message,
        "data": event.data,
        "type": "message",  # metrics are not events here: GET /v1/jobs/{id}/metrics has them
    }


def event_seq(event_id: str) -> int | None:
    tail = event_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isascii() and tail.isdigit() and len(tail) < 19 else None


def checkpoint_object(job: Job, checkpoint: Checkpoint, metrics: dict[str, Any]) -> dict[str, Any]:
    loss = metrics.get("loss")
    return {
        "id": f"ftckpt-{job.id}-{checkpoint.step}",
        "object": "fine_tuning.job.checkpoint",
        "created_at": unix_seconds(checkpoint.created_at),
        "fine_tuned_model_checkpoint": f"{fine_tuned_model(job)}:ckpt-step-{checkpoint.step}",
        "fine_tuning_job_id": job.id,
        "step_number": checkpoint.step,
        "metrics": {
            "step": float(checkpoint.step),
            **({"train_loss": float(loss)} if isinstance(loss, (int, float)) else {}),
        },
    }


def model_object(model_id: str, created: int, owned_by: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": owned_by}
