"""Response models of the API (requests are JobSpec, multipart uploads and query strings)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Generic, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from contract.estimate import JobEstimate
from contract.spec import variant_of
from models.tables import FilePurpose, FileStatus, JobStatus  # noqa: F401  (JobStatus: re-exported)

T = TypeVar("T")



class ErrorItem(BaseModel):
    line: int | None = Field(None, description="1-based line of an uploaded file.")
    field: str | None = Field(None, examples=["chosen"])
    message: str = Field(..., examples=["must not be empty"])


class ErrorDetail(BaseModel):
    message: str = Field(..., examples=["training_file: no such file"])
    type: str = Field(..., examples=["invalid_request_error"])
    field: str | None = Field(None, examples=["training_file"])
    errors: list[dict[str, Any]] | None = None
    request_id: str | None = Field(None, examples=["9f1c0b6e2d8a4f0e8c1d2b3a4f5e6d7c"])


class ErrorResponse(BaseModel):
    error: ErrorDetail


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route that may answer with these error statuses."""
    return {status: {"model": ErrorResponse} for status in statuses}


class Page(BaseModel, Generic[T]):
    """A page of a cursor-paginated list: pass `last_id` as `after` for the next one."""

    object: Literal["list"] = "list"
    data: list[T]
    has_more: bool = Field(..., examples=[False])
    first_id: str | int | None = None
    last_id: str | int | None = None


def example(response: dict[str, Any]) -> ConfigDict:
    """The model_config of a response model with this example in its OpenAPI schema."""
    return ConfigDict(json_schema_extra={"examples": [response]})


class RowOut(BaseModel):
    """A response read off a table row (an ORM object, or a Row of its columns): each field but
    `object` is the row's attribute of the same name, unless `derived(row)` gives it (a field
    the row stores under another name or in another shape)."""

    @classmethod
    def derived(cls, row: Any) -> dict[str, Any]:
        return {}

    @classmethod
    def fields_of(cls, row: Any) -> dict[str, Any]:
        derived = cls.derived(row)
        copied = (name for name in cls.model_fields if name not in derived and name != "object")
        return {**{name: getattr(row, name) for name in copied}, **derived}

    @classmethod
    def of(cls, row: Any) -> Self:
        return cls(**cls.fields_of(row))


class FileOut(RowOut):
    model_config = example(
        {
            "id": "file-019a4b5c6d7e8f9a0b1c2d3e4f5a",
            "object": "file",
            "filename": "prefs.jsonl",
            "purpose": "train",
            "bytes": 18234,
            "sha256": "9b74c9897bac770ffc029102a200c5de...",
            "format": "preference",
            "records": 128,
            "status": "processed",
            "created_at": 1763706600,
        }
    )
    # Typed as OpenAI's file object (integer created_at, its purposes and statuses), so the
    # `openai` package reads our files as its own.

    id: str
    object: Literal["file"] = "file"
    filename: str
    purpose: FilePurpose
    bytes: int
    sha256: str
    format: str | None
    records: int
    status: FileStatus
    error: dict[str, Any] | None = None
    warnings: list[str] = Field(default_factory=list, description="E.g. unknown columns.")
    created_at: int = Field(..., description="Unix seconds, as OpenAI's file object.")

    @classmethod
    def derived(cls, row: Any) -> dict[str, Any]:
        return {
            "warnings": row.warnings or [],
            "created_at": unix_seconds(row.created_at),
            "error": None,  # a stored file was valid
        }


def unix_seconds(when: datetime) -> int:
    """A stored timestamp (naive UTC on SQLite, aware on PostgreSQL) as Unix seconds."""
    return int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp())


class Deleted(BaseModel):
    id: str
    object: str
    deleted: bool = True


class TrainingOut(BaseModel):
    """How the trainer runs the job's batches: its own choice unless the spec set it (issue
    25). Each batch is `grad_accum` micro-batches of `micro_batch` examples per process."""

    grad_accum: int | None = Field(None, description="Micro-batches per optimizer step.")
    micro_batch: int | None = Field(None, description="Examples per micro-batch per process.")
    activation_checkpointing: bool | None = None
    compile: bool | None = None
    memory_estimate_gib: float | None = Field(
        None, description="The trainer's estimate of the memory one GPU needs."
    )
    memory_available_gib: float | None = Field(None, description="What one GPU had free.")
    attempt: int | None = Field(None, description="The attempt that made this choice.")


class JobOut(RowOut):
    model_config = example(
        {
            "id": "job-019a4b5c6d7e8f9a0b1c2d3e4f5a",
            "object": "job",
            "status": "running",
            "base_model": "smollm2-135m-instruct",
            "objective": "dpo",
            "variant": "offline+humanline",
            "training_file": "file-019a4b5c6d7e...",
            "metadata": {"experiment": "sweep-3"},
            "attempt": 1,
            "current_step": 40,
            "total_steps": 200,
            "error": None,
            "result": None,
            "created_at": "2026-11-21T06:30:00Z",
            "updated_at": "2026-11-21T06:31:00Z",
            "started_at": "2026-11-21T06:30:05Z",
            "finished_at": None,
            "spec": {"base_model": "smollm2-135m-instruct", "objective": {"name": "dpo"}},
            "training": {
                "grad_accum": 2, "micro_batch": 4, "activation_checkpointing": True,
                "compile": False, "memory_estimate_gib": 61.5, "memory_available_gib": 79.2,
                "attempt": 1,
            },
        }
    )

    id: str
    object: Literal["job"] = "job"
    status: JobStatus
    base_model: str
    objective: str
    variant: str
    training_file: str | None
    metadata: dict[str, Any]
    attempt: int
    current_step: int
    total_steps: int | None
    error: dict[str, Any] | None
    result: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    spec: dict[str, Any]
    training: TrainingOut | None = Field(
        None,
        description="The trainer's choice of micro-batch (updated when it runs out of memory "
        "and halves it); null before the trainer starts. Shown by GET /v1/jobs/{job_id} only: "
        "null in lists and other responses (it is read off the job's events).",
    )
    estimate: JobEstimate | None = Field(
        None,
        description="The cost predicted when the job was created (POST /v1/jobs/estimate's "
        "figures). Shown by GET /v1/jobs/{job_id} and the create response; null in lists.",
    )

    @classmethod
    def derived(cls, row: Any) -> dict[str, Any]:
        spec = row.spec or {}
        return {
            "variant": variant_of(spec),
            "training_file": spec.get("training_file"),
            "metadata": row.meta or {},
            "spec": spec,
            "training": None,  # GET /v1/jobs/{job_id} reads it (models.job_events)
            "estimate": None,  # the same
        }

    @classmethod
    def of(cls, row: Any) -> JobOut:
        # built from a row the service wrote (no validation): a page of 20 jobs with their
        # specs is the hottest read of the API
        return cls.model_construct(**cls.fields_of(row))


class EstimateOut(JobEstimate):
    """POST /v1/jobs/estimate: the spec as the job would store it (every default resolved,
    the batch fitted to the data) and what it would cost (contract.estimate.JobEstimate)."""

    object: Literal["job.estimate"] = "job.estimate"
    spec: dict[str, Any]
    warnings: list[str] = Field(default_factory=list, description="What create would warn.")


class EventOut(RowOut):
    model_config = example(
        {
            "seq": 3,
            "object": "job.event",
            "kind": "status",
            "message": "queued → running",
            "data": {"from": "queued", "to": "running", "attempt": 1},
            "created_at": "2026-11-21T06:30:05Z",
        }
    )

    seq: int
    object: Literal["job.event"] = "job.event"
    kind: str
    message: str
    data: dict[str, Any] | None
    created_at: datetime


class MetricOut(RowOut):
    model_config = example(
        {
            "step": 10,
            "values": {"loss": 0.61, "clip_fraction": 0.03, "grad_norm": 0.8},
        }
    )

    step: int
    values: dict[str, Any]


class MetricsPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[MetricOut]
    has_more: bool


class CheckpointOut(RowOut):
    model_config = example(
        {
            "object": "checkpoint",
            "job_id": "job-019a...",
            "step": 100,
            "bytes": 540000000,
            "files": ["model.safetensors", "config.json"],
            "created_at": "2026-11-21T06:40:00Z",
        }
    )

    object: Literal["checkpoint"] = "checkpoint"
    job_id: str
    step: int
    bytes: int
    files: list[str] | None
    created_at: datetime


class Health(BaseModel):
    status: Literal["ok", "unavailable"] = "ok"
    checks: dict[str, str] = Field(default_factory=dict)
