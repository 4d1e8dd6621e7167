"""Typed response objects and the shapes of request parameters.

Responses are pydantic models that tolerate what a newer server may add: unknown fields are
kept (`model_extra`, attribute access) and enum-like fields are `Literal[...] | str`, so a new
job status parses instead of failing. Every object remembers the X-Request-ID of the response
it came from as `_request_id`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional, Union

from pydantic import BaseModel as _PydanticBaseModel
from pydantic import ConfigDict, PrivateAttr

try:  # TypedDict with total=False and Literal from typing (3.9 has both)
    from typing import Literal, TypedDict
except ImportError:  # pragma: no cover
    from typing_extensions import Literal, TypedDict  # type: ignore[assignment]

__all__ = [
    "TERMINAL_STATUSES",
    "AdapterParams",
    "BaseModel",
    "Checkpoint",
    "FileDeleted",
    "FileObject",
    "FilePurpose",
    "HumanlineParams",
    "Job",
    "JobEvent",
    "JobStatus",
    "Metric",
    "Objective",
    "ObjectiveParams",
    "OptimParams",
    "Variant",
]

JobStatus = Literal[
    "validating", "queued", "running", "cancelling", "cancelled", "succeeded", "failed"
]
TERMINAL_STATUSES: tuple[str, ...] = ("succeeded", "failed", "cancelled")
FilePurpose = Literal["train", "eval"]
FileStatus = Literal["uploaded", "processed", "error"]
Objective = Literal["dpo", "kto", "grpo"]
Variant = Literal["offline", "online", "offline+humanline", "online+humanline"]


class BaseModel(_PydanticBaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True, protected_namespaces=())
    _request_id: Optional[str] = PrivateAttr(default=None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, unknown fields included."""
        return self.model_dump(mode="json")

    def to_json(self, *, indent: Optional[int] = 2) -> str:
        return self.model_dump_json(indent=indent)


class FileObject(BaseModel):
    """An uploaded JSONL file (validated on upload; `format` is what was detected)."""

    id: str
    object: str = "file"
    filename: str = ""
    purpose: Union[FilePurpose, str] = "train"
    bytes: int = 0
    sha256: Optional[str] = None
    format: Optional[str] = None
    records: int = 0
    status: Union[FileStatus, str] = "processed"
    error: Optional[dict[str, Any]] = None
    created_at: Optional[datetime] = None


class FileDeleted(BaseModel):
    id: str
    object: str = "file"
    deleted: bool = True


class Job(BaseModel):
    """A training job. `status` moves validating → queued → running → succeeded | failed |
    cancelled (with `cancelling` in between when a running job is cancelled)."""

    id: str
    object: str = "job"
    status: Union[JobStatus, str]
    base_model: str = ""
    objective: Union[Objective, str] = ""
    variant: Union[Variant, str] = ""
    training_file: Optional[str] = None
    metadata: dict[str, Any] = {}
    attempt: int = 0
    current_step: int = 0
    total_steps: Optional[int] = None
    error: Optional[dict[str, Any]] = None
    result: Optional[dict[str, Any]] = None
    created_at: Optional[datetime] = None
    updated_at: Optional[datetime] = None
    started_at: Optional[datetime] = None
    finished_at: Optional[datetime] = None
    spec: dict[str, Any] = {}

    @property
    def is_terminal(self) -> bool:
        """True once the job can no longer change (succeeded, failed or cancelled)."""
        return self.status in TERMINAL_STATUSES


class JobEvent(BaseModel):
    """One entry of a job's event log; `seq` is gap-free per job, starting at 1."""

    seq: int
    object: str = "job.event"
    kind: str = ""
    message: str = ""
    data: Optional[dict[str, Any]] = None
    created_at: Optional[datetime] = None


class Metric(BaseModel):
    """The metrics logged at one optimizer step (`values["loss"]`, `values["clip_fraction"]`...)."""

    step: int
    values: dict[str, Any] = {}

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)


class Checkpoint(BaseModel):
    object: str = "checkpoint"
    job_id: str = ""
    step: int
    bytes: int = 0
    files: Optional[list[str]] = None
    created_at: Optional[datetime] = None


# --- request parameter shapes (all keys optional; the server fills in the paper's defaults) --


class ObjectiveParams(TypedDict, total=False):
    name: Objective
    beta: float  # DPO, KTO
    reference_free: bool  # DPO
    lambda_d: float  # KTO
    lambda_u: float  # KTO
    beta_kl: float  # GRPO
    epsilon: float  # GRPO


class HumanlineParams(TypedDict, total=False):
    log_eps_P: float
    log_eps_R: float
    sync_every: int
    mode: Literal["clip", "sample"]
    M_P: float
    M_R: float
    gamma_P: float
    beta_P: float
    gamma_R: float
    beta_R: float


class OptimParams(TypedDict, total=False):
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    warmup_ratio: float
    schedule: Literal["linear", "cosine", "constant"]
    max_grad_norm: float


class AdapterParams(TypedDict, total=False):
    kind: Literal["none", "lora"]
    r: int
    alpha: float
    dropout: float
    target_modules: list[str]
