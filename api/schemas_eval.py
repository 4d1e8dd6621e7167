"""Request and response models of /v1/evaluations and the reports."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from models.tables import Evaluation

EvalKind = Literal["instruction", "math"]
EvalStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
EVAL_FORMATS: dict[str, str] = {"instruction": "eval_instruction", "math": "eval_math"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpenAIJudgeIn(_Strict):
    """An OpenAI-compatible chat endpoint (vLLM, a hosted model, the bundled local server).
    `base_url` must be one the operator allows (EVAL_JUDGE_BASE_URLS); the API key is the
    server's own (EVAL_JUDGE_API_KEY), never sent in a request, stored or returned."""

    type: Literal["openai"] = "openai"
    base_url: str = Field(..., min_length=1, max_length=500, examples=["http://judge:8000/v1"])
    model: str = Field(..., min_length=1, max_length=200, examples=["gpt-4.1"])


class RewardModelJudgeIn(_Strict):
    """A local sequence-classification reward model, by a name the operator configured
    (EVAL_REWARD_MODELS); users never name paths."""

    type: Literal["reward_model"] = "reward_model"
    model: str = Field(..., min_length=1, max_length=100, examples=["armorm"])


JudgeIn = Annotated[OpenAIJudgeIn | RewardModelJudgeIn, Field(discriminator="type")]


class GenerationIn(_Strict):
    """Sampling settings; unset fields take the kind's defaults (instruction: one greedy
    answer of up to 512 tokens; math: n=4 at temperature 0.7, top-p 0.95, 1024 tokens)."""

    n: int | None = Field(None, ge=1, le=64, description="Samples per problem (math only).")
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_new_tokens: int | None = Field(None, ge=1, le=8192)
    seed: int = Field(0, ge=0, le=2**31 - 1)


GENERATION_DEFAULTS: dict[str, dict[str, Any]] = {
    "instruction": {"n": 1, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 512},
    "math": {"n": 4, "temperature": 0.7, "top_p": 0.95, "max_new_tokens": 1024},
}


class EvaluationCreate(_Strict):
    """Evaluate a job's checkpoint (its exported final model unless `step` names a saved
    checkpoint) or a base model on an eval file (purpose `eval`)."""

    job_id: str | None = Field(None, max_length=64)
    step: int | None = Field(None, ge=0, description="A checkpoint step of the job.")
    base_model: str | None = Field(None, max_length=255)
    file_id: str = Field(..., max_length=64)
    kind: EvalKind
    judge: JudgeIn | None = None
    generation: GenerationIn = Field(default_factory=GenerationIn)
    prompt_template: str | None = Field(
        None, max_length=4000, description="Math only: the user turn; '{problem}' is replaced."
    )
    system_prompt: str | None = Field(None, max_length=4000, description="Math only.")
    max_items: int | None = Field(None, ge=1, le=100_000, description="Evaluate the first N items.")

    def problem(self) -> tuple[str, str] | None:
        """The first cross-field mistake as (field path, message), or None. Checked by the
        route, so that every 422 names its field."""
        if (self.job_id is None) == (self.base_model is None):
            return "job_id", "give exactly one of job_id and base_model"
        if self.step is not None and self.job_id is None:
            return "step", "step names a checkpoint of a job; give job_id too"
        if self.kind == "instruction":
            if self.judge is None:
                return "judge", "an instruction evaluation needs a judge"
            if self.generation.n not in (None, 1):
                return "generation.n", "instruction evaluations generate one answer per instruction"
            if self.prompt_template is not None:
                return "prompt_template", "prompt_template is for math evaluations"
            if self.system_prompt is not None:
                return "system_prompt", "system_prompt is for math evaluations"
        if self.kind == "math" and self.judge is not None:
            return "judge", "math evaluations are checked with math-verify, not judged"
        if self.prompt_template is not None and "{problem}" not in self.prompt_template:
            return "prompt_template", "must contain '{problem}'"
        return None

    def resolved_generation(self) -> dict[str, Any]:
        out = dict(GENERATION_DEFAULTS[self.kind])
        out.update({k: v for k, v in self.generation.model_dump().items() if v is not None})
        return out


class EvaluationOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
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
            ]
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
    def of(cls, row: Evaluation) -> EvaluationOut:
        config = dict(row.config or {})
        result = dict(row.result) if row.result else None
        if result is not None:
            result.pop("report", None)  # object keys are ours; the report routes serve them
        return cls(
            id=row.id,
            status=row.status,  # type: ignore[arg-type]
            kind=row.kind,  # type: ignore[arg-type]
            job_id=row.job_id,
            step=config.get("step"),
            base_model=row.base_model,
            file_id=row.file_id,
            config=config,
            result=result,
            error=row.error,
            created_at=row.created_at,
            updated_at=row.updated_at,
            finished_at=row.finished_at,
        )


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
