"""Request and response models of /v1/evaluations and the reports."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from api.schemas import RowOut, example
from contract.evaluation import (  # noqa: F401  (re-exported for the routes)
    GENERATION_DEFAULTS,
    EvalKind,
    EvalRequest,
    GenerationIn,
    JudgeIn,
    OpenAIJudgeIn,
    RewardModelJudgeIn,
)
from models.tables import EvalStatus, Evaluation  # noqa: F401  (EvalStatus: re-exported)


class EvaluationCreate(EvalRequest):
    """Evaluate a job's checkpoint (its exported final model unless `step` names a saved
    checkpoint) or a base model on an eval file (purpose `eval`)."""

    job_id: str | None = Field(None, max_length=64)
    step: int | None = Field(None, ge=0, description="A checkpoint step of the job.")
    base_model: str | None = Field(None, max_length=255)

    def problem(self) -> tuple[str, str] | None:
        """The first cross-field mistake as (field path, message), or None. Checked by the
        route, so that every 422 names its field."""
        if (self.job_id is None) == (self.base_model is None):
            return "job_id", "give exactly one of job_id and base_model"
        if self.step is not None and self.job_id is None:
            return "step", "step names a checkpoint of a job; give job_id too"
        return super().problem()


class EvaluationOut(RowOut):
    model_config = example(
        {
            "id": "eval-019a4b5c6d7e8f9a0b1c2d3e4f5a",
            "object": "evaluation",
            "status": "succeeded",
            "kind": "instruction",
            "job_id": "job-019a...",
            "step": None,
            "base_model": None,
            "file_id": "file-019a...",
            "config": {
                "judge": {
                    "type": "openai",
                    "base_url": "http://judge:8000/v1",
                    "model": "gpt-4.1",
                },
                "generation": {"n": 1, "temperature": 0.0, "max_new_tokens": 512},
            },
            "result": {
                "metrics": {
                    "lc_win_rate": {"value": 0.41, "se": 0.017},
                    "win_rate": {"value": 0.38, "se": 0.016},
                }
            },
        }
    )

    id: str
    object: Literal["evaluation"] = "evaluation"
    status: EvalStatus
    kind: EvalKind
    job_id: str | None
    step: int | None
    base_model: str | None
    file_id: str | None
    config: dict[str, Any]
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @classmethod
    def derived(cls, row: Any) -> dict[str, Any]:
        config = dict(row.config or {})
        result = dict(row.result) if row.result else None
        if result is not None:
            result.pop("report", None)  # object keys are ours; the report routes serve them
        return {"step": config.get("step"), "config": config, "result": result}


def eval_summary(row: Evaluation) -> dict[str, Any]:
    """What a report page needs of an evaluation (no per-item records)."""
    config = row.config or {}
    result = row.result or {}
    judge = config.get("judge") or {}
    return {
        "id": row.id,
        "kind": row.kind,
        "status": row.status,
        "job_id": row.job_id,
        "step": config.get("step"),
        "base_model": row.base_model,
        "file_id": row.file_id,
        "metrics": result.get("metrics") or {},
        "judge": f"{judge.get('type')}:{judge.get('model')}" if judge else None,
        "error": row.error,
        "created_at": row.created_at.isoformat() if row.created_at else None,
        "finished_at": row.finished_at.isoformat() if row.finished_at else None,
    }
