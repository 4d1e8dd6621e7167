"""The job spec: one pydantic model that the CLI, the API and the worker all validate with.

No torch here: the API imports this module. Defaults are the paper's (DESIGN.md §2); every
objective-specific default lives on its objective class, so the choice is made in one place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainer.rewards.base import RewardSpec
from trainer.spec.evaluation import EvalRequest
from trainer.rewards.registry import MATH_REWARDS, REWARDS

ObjectiveName = Literal["dpo", "kto", "grpo"]
DataSource = Literal["offline", "online"]
ReferenceSync = Literal["humanline", "trust_region", "none"]
VARIANTS = ("offline", "online", "offline+humanline", "online+humanline")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DPOConfig(_Strict):
    """Direct Preference Optimization: loss = -log σ(β (R_w − R_l))."""

    name: Literal["dpo"] = "dpo"
    beta: float = Field(0.1, gt=0, examples=[0.1])
    reference_free: bool = Field(False, description="Treat the reference log-probs as zero.")
    trains_on: ClassVar[tuple[str, ...]] = ("preference",)
    default_lr: ClassVar[float] = 5e-6
    default_batch_size: ClassVar[int] = 32


class KTOConfig(_Strict):
    """Kahneman-Tversky Optimization with the mismatched-pair KL estimate z0."""

    name: Literal["kto"] = "kto"
    beta: float = Field(0.25, gt=0)
    lambda_d: float = Field(1.1, gt=0, description="Weight of desirable examples.")
    lambda_u: float = Field(1.0, gt=0, description="Weight of undesirable examples.")
    trains_on: ClassVar[tuple[str, ...]] = ("preference", "unpaired")
    default_lr: ClassVar[float] = 5e-6
    default_batch_size: ClassVar[int] = 64


class GRPOConfig(_Strict):
    """Group Relative Policy Optimization with DAPO token-level normalisation."""

    name: Literal["grpo"] = "grpo"
    beta_kl: float = Field(0.01, ge=0, description="Weight of the (never clamped) k3 KL term.")
    epsilon: float | None = Field(
        None, gt=0, lt=1, description="PPO clip range; default 0.15 online, 0.5 offline."
    )
    trains_on: ClassVar[tuple[str, ...]] = ("preference",)
    default_lr: ClassVar[float] = 5e-6
    default_batch_size: ClassVar[int] = 64


Objective = Annotated[Union[DPOConfig, KTOConfig, GRPOConfig], Field(discriminator="name")]


class HumanlineParams(_Strict):
    """Humanline clipping/sampling and syncing parameters (DESIGN.md §2)."""

    log_eps_P: float = Field(-1.5, description="Lower clamp of the token log-ratio (log ε_P).")
    log_eps_R: float = Field(1.5, description="Upper clamp of the token log-ratio (log ε_R).")
    sync_every: int = Field(1, ge=1, description="k: sync the reference every k optimizer steps.")
    mode: Literal["clip", "sample"] = "clip"
    # Humanline sampling: reject token t when π/π_ref < M_P·B_P or π_ref/π < M_R·B_R.
    M_P: float = Field(1.0, gt=0)
    M_R: float = Field(1.0, gt=0)
    gamma_P: float = Field(1.0, gt=0)
    beta_P: float = Field(1.0, gt=0)
    gamma_R: float = Field(1.0, gt=0)
    beta_R: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _range(self) -> HumanlineParams:
        if not self.log_eps_P < self.log_eps_R:
            raise ValueError(
                f"log_eps_P ({self.log_eps_P}) must be below log_eps_R ({self.log_eps_R})"
            )
        return self


class OptimConfig(_Strict):
    """AdamW with linear warm-up; lr defaults to the objective's paper value."""

    lr: float | None = Field(None, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    max_grad_norm: float = Field(1.0, gt=0)


class AdapterConfig(_Strict):
    kind: Literal["none", "lora"] = "none"
    r: int = Field(16, ge=1)
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )


class OnlineConfig(_Strict):
    """Round-based online data (paper, Algorithm 1): every `sample_every` steps, sample
    `num_samples` completions per prompt from the current policy, score them, and train the
    next `sample_every` steps on what survives the τ filter."""

    rewards: list[RewardSpec] = Field(
        default_factory=lambda: list(MATH_REWARDS),
        min_length=1,
        description="Registered reward sources with weights; default: the paper's math setup "
        "(tag_count 1, format 1, math_accuracy 8).",
    )
    num_samples: int = Field(8, ge=2, description="G: completions sampled per prompt.")
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_new_tokens: int = Field(256, ge=1)
    tau: float = Field(0.01, ge=0, description="Keep a prompt when max − min score ≥ τ.")
    sample_every: int = Field(
        32, ge=1, description="Steps per round: sample once, then train this many steps."
    )
    grpo_keep: Literal["all", "extremes"] = Field(
        "all", description="GRPO groups: all G completions, or only the best and worst."
    )
    engine: Literal["auto", "vllm", "hf"] = "auto"
    prompt_budget: float = Field(
        4.0, ge=1, description="Most prompts a round samples, as a multiple of those it needs."
    )

    @field_validator("rewards")
    @classmethod
    def _registered(cls, rewards: list[RewardSpec]) -> list[RewardSpec]:
        for r in rewards:
            if r.name not in REWARDS:
                raise ValueError(f"unknown reward {r.name!r}; registered: {', '.join(sorted(REWARDS))}")
        return rewards


class JobSpec(_Strict):
    """Everything needed to reproduce one training run."""

    base_model: str = Field(
        ...,
        min_length=1,
        description="'smollm2-135m-instruct', 'tiny-llama', or a local HF model directory.",
        examples=["smollm2-135m-instruct"],
    )
    training_file: str = Field(
        ..., min_length=1, description="JSONL path (CLI) or file id (API).", examples=["file-abc"]
    )
    objective: Objective
    data_source: DataSource = "offline"
    humanline: bool = False
    online: OnlineConfig | None = Field(
        None, description="Sampling and rewards; required (defaults filled) when online."
    )
    humanline_params: HumanlineParams = Field(default_factory=HumanlineParams)
    reference_sync: ReferenceSync | None = Field(
        None, description="Default: 'humanline' for humanline jobs, else 'none'."
    )
    length_normalize: bool = False
    optim: OptimConfig = Field(default_factory=OptimConfig)
    batch_size: int | None = Field(None, ge=1, description="Global batch (pairs or examples).")
    grad_accum: int = Field(1, ge=1)
    max_steps: int | None = Field(None, ge=1)
    epochs: int = Field(1, ge=1)
    max_prompt_length: int = Field(512, ge=1)
    max_length: int = Field(1024, ge=2, description="Prompt + completion tokens.")
    seed: int = 0
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    adapter: AdapterConfig = Field(default_factory=AdapterConfig)
    checkpoint_every: int = Field(0, ge=0, description="Steps between checkpoints; 0 = end only.")
    evaluations: list[EvalRequest] = Field(
        default_factory=list, max_length=8,
        description="Evaluations to run on the final model when the job succeeds (service only).",
    )
    log_every: int = Field(1, ge=1)
    quality_sample: int = Field(256, ge=0, description="Examples scored for the data signal.")
    metadata: dict[str, str] = Field(default_factory=dict)

    @field_validator("evaluations")
    @classmethod
    def _evaluations(cls, evaluations: list[EvalRequest]) -> list[EvalRequest]:
        for i, ev in enumerate(evaluations):
            if (problem := ev.problem()) is not None:
                raise ValueError(f"evaluations.{i}.{problem[0]}: {problem[1]}")
        return evaluations

    @model_validator(mode="before")
    @classmethod
    def _expand_shorthands(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("objective"), str):
            data["objective"] = {"name": data["objective"]}
        variant = data.pop("variant", None)
        if variant is not None:
            if variant not in VARIANTS:
                raise ValueError(f"variant must be one of {', '.join(VARIANTS)}")
            data.setdefault("data_source", variant.split("+")[0])
            data.setdefault("humanline", variant.endswith("+humanline"))
        return data

    @model_validator(mode="after")
    def _check(self) -> JobSpec:
        if self.max_prompt_length >= self.max_length:
            raise ValueError("max_prompt_length must be smaller than max_length")
        if self.data_source == "online" and self.max_steps is None:
            raise ValueError("online jobs need max_steps (their data is sampled as they train)")
        if self.data_source == "online" and self.online is None:
            self.online = OnlineConfig()
        if self.data_source == "offline" and self.online is not None:
            raise ValueError("'online' settings need data_source 'online'")
        if self.humanline and getattr(self.objective, "reference_free", False):
            raise ValueError("humanline needs a reference model; reference_free DPO has none")
        if self.batch_size is not None and self.batch_size % self.grad_accum:
            raise ValueError("batch_size must be divisible by grad_accum")
        return self

    # --- resolved values: the one place each default is decided -------------------------
    @property
    def variant(self) -> str:
        return self.data_source + ("+humanline" if self.humanline else "")

    @property
    def sync(self) -> ReferenceSync:
        if self.reference_sync is not None:
            return self.reference_sync
        return "humanline" if self.humanline else "none"

    @property
    def training_formats(self) -> tuple[str, ...]:
        """Training-file formats this job can learn from (online jobs sample from prompts)."""
        return ("prompt",) if self.data_source == "online" else self.objective.trains_on

    @property
    def lr(self) -> float:
        return self.optim.lr if self.optim.lr is not None else self.objective.default_lr

    @property
    def global_batch_size(self) -> int:
        return self.batch_size if self.batch_size is not None else self.objective.default_batch_size

    @property
    def grpo_epsilon(self) -> float:
        eps = getattr(self.objective, "epsilon", None)
        if eps is not None:
            return eps
        return 0.5 if self.data_source == "offline" else 0.15


def load_spec(path: str | Path) -> JobSpec:
    """Read a spec from YAML or JSON; raises pydantic.ValidationError with field paths."""
    import yaml

    text = Path(path).read_text()
    data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    return JobSpec.model_validate(data)
