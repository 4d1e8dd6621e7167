"""Response models of the API (requests are JobSpec, multipart uploads and query strings)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from models.tables import Checkpoint, File, Job, JobEvent, JobMetric

T = TypeVar("T")

JobStatus = Literal[
    "validating", "queued", "running", "cancelling", "cancelled", "succeeded", "failed"
]


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


class Page(BaseModel, Generic[T]):
    """A page of a cursor-paginated list: pass `last_id` as `after` for the next one."""

    object: Literal["list"] = "list"
    data: list[T]
    has_more: bool = Field(..., examples=[False])
    first_id: str | int | None = None
    last_id: str | int | None = None


class FileOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
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
                    "created_at": "2026-11-21T06:30:00Z",
                }
            ]
        }
    )

    id: str
    object: Literal["file"] = "file"
    filename: str
    purpose: Literal["train", "eval"]
    bytes: int
    sha256: str
    format: str | None
    records: int
    status: str
    error: dict[str, Any] | None = None
    created_at: datetime

    @classmethod
    def of(cls, row: File) -> FileOut:
        return cls(
            id=row.id,
            filename=row.filename,
            purpose=row.purpose,  # type: ignore[arg-type]
            bytes=row.bytes,
            sha256=row.sha256,
            format=row.format,
            records=row.records,
            status=row.status,
            error=row.error,
            created_at=row.created_at,
        )


class Deleted(BaseModel):
    id: str
    object: str
    deleted: bool = True


class JobOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
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
                }
            ]
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

    @classmethod
    def of(cls, row: Job) -> JobOut:
        spec = row.spec or {}
        variant = spec.get("data_source", "offline") + (
            "+humanline" if spec.get("humanline") else ""
        )
        # built from a row the service wrote (no validation): a page of 20 jobs with their
        # specs is the hottest read of the API
        return cls.model_construct(
            id=row.id,
            status=row.status,
            base_model=row.base_model,  # type: ignore[arg-type]
            objective=row.objective,
            variant=variant,
            training_file=spec.get("training_file"),
            metadata=row.meta or {},
            attempt=row.attempt,
            current_step=row.current_step,
            total_steps=row.total_steps,
            error=row.error,
            result=row.result,
            created_at=row.created_at,
            updated_at=row.updated_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            spec=spec,
        )


class EventOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "seq": 3,
                    "object": "job.event",
                    "kind": "status",
                    "message": "queued → running",
                    "data": {"from": "queued", "to": "running", "attempt": 1},
                    "created_at": "2026-11-21T06:30:05Z",
                }
            ]
        }
    )

    seq: int
    object: Literal["job.event"] = "job.event"
    kind: str
    message: str
    data: dict[str, Any] | None
    created_at: datetime

    @classmethod
    def of(cls, row: JobEvent) -> EventOut:
        return cls(
            seq=row.seq,
            kind=row.kind,
            message=row.message,
            data=row.data,
            created_at=row.created_at,
        )


class MetricOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "step": 10,
                    "values": {"loss": 0.61, "clip_fraction": 0.03, "grad_norm": 0.8},
                }
            ]
        }
    )

    step: int
    values: dict[str, Any]

    @classmethod
    def of(cls, row: JobMetric) -> MetricOut:
        return cls(step=row.step, values=row.values)


class MetricsPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[MetricOut]
    has_more: bool


class CheckpointOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "object": "checkpoint",
                    "job_id": "job-019a...",
                    "step": 100,
                    "bytes": 540000000,
                    "files": ["model.safetensors", "config.json"],
                    "created_at": "2026-11-21T06:40:00Z",
                }
            ]
        }
    )

    object: Literal["checkpoint"] = "checkpoint"
    job_id: str
    step: int
    bytes: int
    files: list[str] | None
    created_at: datetime

    @classmethod
    def of(cls, row: Checkpoint) -> CheckpointOut:
        return cls(
            job_id=row.job_id,
            step=row.step,
            bytes=row.bytes,
            files=row.files,
            created_at=row.created_at,
        )


class Health(BaseModel):
    status: Literal["ok", "unavailable"] = "ok"
    checks: dict[str, str] = Field(default_factory=dict)
