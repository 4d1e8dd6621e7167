"""Typed response objects and the shapes of request parameters.

Responses are pydantic models that tolerate what a newer server may add: unknown fields are
kept (`model_extra`, attribute access) and enum-like fields are `Literal[...] | str`, so a new
job status parses instead of failing. Every object remembers the X-Request-ID of the response
it came from as `_request_id`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Optional, Union  # Python >= 3.9

from pydantic import BaseModel as _PydanticBaseModel
from pydantic import ConfigDict, PrivateAttr

from humanline_client.params import (  # the request shapes, re-exported
    AdapterParams,
    EvaluationKind,
    EvaluationParams,
    GenerationParams,
    HumanlineParams,
    JudgeParams,
    Objective,
    ObjectiveParams,
    OnlineParams,
    OpenAIJudgeParams,
    OptimParams,
    ParallelParams,
    RewardModelJudgeParams,
    RewardParams,
    VLLMParams,
)

__all__ = [
    "EVALUATION_TERMINAL_STATUSES",
    "TERMINAL_STATUSES",
    "AdapterParams",
    "BaseModel",
    "Checkpoint",
    "CompareMetric",
    "Comparison",
    "ComparisonGroup",
    "ComparisonGroups",
    "ComparisonRow",
    "ComparisonTest",
    "Evaluation",
    "EvaluationKind",
    "EvaluationParams",
    "EvaluationReport",
    "EvaluationStatus",
    "FileDeleted",
    "FileObject",
    "FilePurpose",
    "GenerationParams",
    "GroupPoint",
    "HumanlineParams",
    "Job",
    "JobEstimate",
    "JobEvent",
    "JobReport",
    "JobStatus",
    "JobTraining",
    "JudgeParams",
    "Metric",
    "Objective",
    "ObjectiveParams",
    "OnlineParams",
    "OpenAIJudgeParams",
    "OptimParams",
    "ParallelParams",
    "ReportFormat",
    "RewardModelJudgeParams",
    "RewardParams",
    "VLLMParams",
    "Variant",
]

JobStatus = Literal[
    "validating", "queued", "running", "cancelling", "cancelled", "succeeded", "failed"
]
TERMINAL_STATUSES: tuple[str, ...] = ("succeeded", "failed", "cancelled")
FilePurpose = Literal["train", "eval"]
FileStatus = Literal["uploaded", "processed", "error"]
Variant = Literal["offline", "online", "offline+humanline", "online+humanline"]
EvaluationStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
EVALUATION_TERMINAL_STATUSES: tuple[str, ...] = ("succeeded", "failed", "cancelled")
ReportFormat = Literal["json", "html"]
CompareMetric = Literal[
    "lc_win_rate", "win_rate", "avg_length", "pass_at_1", "pass_at_n", "format_rate", "boxed_rate"
]


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


class JobTraining(BaseModel):
    """How the trainer runs a job's batches (`Job.training`): `grad_accum` micro-batches of
    `micro_batch` examples per process, its own choice unless the spec set them; halved when
    the job runs out of memory."""

    grad_accum: Optional[int] = None
    micro_batch: Optional[int] = None
    activation_checkpointing: Optional[bool] = None
    compile: Optional[bool] = None
    memory_estimate_gib: Optional[float] = None
    memory_available_gib: Optional[float] = None
    attempt: Optional[int] = None


class JobEstimate(BaseModel):
    """What a job will cost, predicted before it runs (`jobs.estimate`, and `Job.estimate`:
    kept with the job when it was created). Tokens are approximated from the training file's
    bytes (`tokens_method` says how); wall-clock and GPU-hours come from the server's
    throughput table for its job queue's `device` (docs/estimates.md)."""

    object: str = "job.estimate"
    device: str = ""
    processes: int = 1
    gpus: int = 0
    memory_available_gib: float = 0.0
    micro_batch: int = 0
    grad_accum: int = 0
    activation_checkpointing: bool = False
    memory_gib_per_process: float = 0.0
    memory_fits: bool = True
    steps: int = 0
    examples: int = 0
    tokens: int = 0
    tokens_per_step: int = 0
    tokens_method: str = ""
    sampled_tokens: int = 0
    train_flops: float = 0.0
    train_seconds: float = 0.0
    sampling_seconds: float = 0.0
    startup_seconds: float = 0.0
    wall_clock_seconds: float = 0.0
    gpu_hours: float = 0.0
    sampling_share: float = 0.0
    throughput_source: str = ""
    spec: dict[str, Any] = {}  # `jobs.estimate` only: the spec as the job would store it
    warnings: list[str] = []  # `jobs.estimate` only: what create would warn


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
    training: Optional[JobTraining] = None  # set by `jobs.retrieve` once the trainer started
    estimate: Optional[JobEstimate] = None  # set by `jobs.retrieve` and `jobs.create`

    @property
    def is_terminal(self) -> bool:
        """True once the job can no longer change (succeeded, failed or cancelled)."""
        return self.status in TERMINAL_STATUSES

    @property
    def model_files(self) -> list[str]:
        """The files of the exported model (`jobs.download_model`), [] until the job has
        succeeded with one."""
        final = (self.result or {}).get("final_model")
        files = final.get("files") if isinstance(final, dict) else None
        return [str(f) for f in files] if isinstance(files, list) else []


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


class Evaluation(BaseModel):
    """An evaluation of a job's final model, one of its checkpoints (`step`), or a base model,
    on an eval file. `status` moves queued → running → succeeded | failed. `result` holds the
    summary (`result["metrics"]["lc_win_rate"] == {"value": .., "se": .., "n": ..}`; while
    running, `result["progress"]`); the per-item records are in `evaluations.report(id)`."""

    id: str
    object: str = "evaluation"
    status: Union[EvaluationStatus, str]
    kind: Union[EvaluationKind, str] = ""
    job_id: Optional[str] = None
    step: Optional[int] = None
    base_model: Optional[str] = None
    file_id: Optional[str] = None
    config: dict[str, Any] = {}
    result: Optional[dict[str, Any]] = None
    error: Optional[dict[str, Any]] = None
    created_at: Optional[datetime] = None
    updated_at: Optional[datetime] = None
    finished_at: Optional[datetime] = None

    @property
    def is_terminal(self) -> bool:
        """True once the evaluation can no longer change (succeeded, failed or cancelled)."""
        return self.status in EVALUATION_TERMINAL_STATUSES

    @property
    def metrics(self) -> dict[str, Any]:
        """`result["metrics"]` ({} until it succeeded)."""
        metrics = (self.result or {}).get("metrics")
        return metrics if isinstance(metrics, dict) else {}


class EvaluationReport(BaseModel):
    """The full result of an evaluation (`evaluations.report(id)`): its metrics and every
    item's prompt, answers and verdicts (`items`), plus what else the evaluator recorded
    (`lc_fit`, `breakdown`, `judge`, `generation`, `timing`, `model`, `data`...)."""

    kind: Optional[Union[EvaluationKind, str]] = None
    metrics: dict[str, Any] = {}
    items: list[Any] = []


class JobReport(BaseModel):
    """`jobs.report(id)`: the job (`job`), its training curves (`training["series"][name]` =
    {"steps": [...], "values": [...]}, `training["final"]`), the data-quality histogram, its
    evaluations (summaries), warnings, and the manifest (spec, seed, training data sha256,
    code version, wall-clock per phase). Built on request: current while the job runs."""

    object: str = "report"
    job: dict[str, Any] = {}
    manifest: dict[str, Any] = {}
    training: dict[str, Any] = {}
    data_quality: Optional[dict[str, Any]] = None
    evaluations: list[dict[str, Any]] = []
    warnings: list[str] = []


class ComparisonRow(BaseModel):
    """One job of a comparison and the value of `metric` from its chosen evaluation (the
    newest succeeded one, final model first; `value` is None when it has none)."""

    job_id: str
    objective: Optional[Union[Objective, str]] = None
    variant: Optional[Union[Variant, str]] = None
    metadata: dict[str, Any] = {}
    evaluation_id: Optional[str] = None
    file_id: Optional[str] = None
    step: Optional[int] = None
    value: Optional[float] = None
    se: Optional[float] = None
    n: Optional[int] = None


class ComparisonTest(BaseModel):
    """A z-test of variant `a` against `b` for one objective (`p_holm`: Holm-Bonferroni
    adjusted across the comparison's tests)."""

    objective: Optional[str] = None
    a: str
    b: str
    job_a: Optional[str] = None
    job_b: Optional[str] = None
    difference: Optional[float] = None
    p_value: Optional[float] = None
    p_holm: Optional[float] = None


class GroupPoint(BaseModel):
    """A group's `metric` at one step: mean ± SE over its `n` jobs evaluated there, and the
    completions they had sampled by then (mean)."""

    step: int
    mean: float
    se: Optional[float] = None
    n: int = 0
    sampled: float = 0.0


class ComparisonGroup(BaseModel):
    """The jobs sharing one value of the comparison's `group_by` metadata key."""

    group: str
    jobs: list[str] = []
    final: dict[str, Optional[float]] = {}  # mean, se, n of the jobs' last evaluated step
    curve: list[GroupPoint] = []
    sampled_completions: float = 0.0
    wall_clock_s: Optional[float] = None


class ComparisonGroups(BaseModel):
    key: str
    groups: list[ComparisonGroup] = []


class Comparison(BaseModel):
    """`reports.compare(jobs=[...])`: one row per job, in the order given, the paper's
    claims tested per objective, and warnings (a job without a usable evaluation, jobs
    evaluated on different files)."""

    object: str = "comparison"
    metric: Union[CompareMetric, str] = "lc_win_rate"
    file_id: Optional[str] = None
    rows: list[ComparisonRow] = []
    tests: list[ComparisonTest] = []
    warnings: list[str] = []
    fallback: Optional[str] = None  # no job has the metric: training metrics shown instead
    groups: Optional[ComparisonGroups] = None  # with group_by=

    def row(self, job_id: str) -> Optional[ComparisonRow]:
        """The row of one job, or None."""
        return next((r for r in self.rows if r.job_id == job_id), None)
