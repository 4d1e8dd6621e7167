"""What an evaluation asks for: eval file, kind, judge, generation. Torch-free and shared by
POST /v1/evaluations and the job spec (a job may name evaluations to run on its final model)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple

from pydantic import ConfigDict, Field

from contract.data import Format
from contract.strict import StrictNumbers

EvalKind = Literal["instruction", "math"]
EVAL_FILE_FORMAT: dict[EvalKind, Format] = {"instruction": "eval_instruction", "math": "eval_math"}


def judge_url(base_url: str) -> str:
    """A judge endpoint as it is compared with the operator's list, stored and called: without
    surrounding spaces or a trailing slash."""
    return base_url.strip().rstrip("/")


class _Strict(StrictNumbers):
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


# An OpenAI-compatible judge's limits: the operator's EVAL_JUDGE_* settings default to these
# (models.settings), and an evaluation run without them (`python -m trainer.evaluation`) uses
# them. timeout: one request; deadline: all retries of one request together.
class JudgeLimits(NamedTuple):
    timeout: float = 60.0
    deadline: float = 600.0
    max_attempts: int = 6
    concurrency: int = 8


OPENAI_JUDGE_DEFAULTS = JudgeLimits()

GENERATION_DEFAULTS: dict[str, dict[str, Any]] = {
    "instruction": {"n": 1, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 512},
    "math": {"n": 4, "temperature": 0.7, "top_p": 0.95, "max_new_tokens": 1024},
}


class EvalRequest(_Strict):
    """An evaluation of a model on an eval file (purpose `eval`)."""

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
        """The first cross-field mistake as (field path, message), or None."""
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

    def stored_judge(self) -> dict[str, Any] | None:
        if self.judge is None:
            return None
        if self.judge.type == "openai":
            url = judge_url(self.judge.base_url)
            return {"type": "openai", "base_url": url, "model": self.judge.model}
        return {"type": "reward_model", "model": self.judge.model}

    def stored_config(self, file: Any, step: int | None = None) -> dict[str, Any]:
        """The evaluation row's `config` (one shape for the API and the worker); `file` is
        the eval file's row (sha256, format, records)."""
        config: dict[str, Any] = {
            "step": step,
            "judge": self.stored_judge(),
            "generation": self.resolved_generation(),
            "file": {"sha256": file.sha256, "format": file.format, "records": file.records},
        }
        for key in ("prompt_template", "system_prompt", "max_items"):
            if getattr(self, key) is not None:
                config[key] = getattr(self, key)
        return config
