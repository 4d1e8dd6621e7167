"""The job spec: one pydantic model that the CLI, the API and the worker all validate with.

No torch here: the API, the worker and the trainer all import this module. Defaults are the
paper's (DESIGN.md §2); every objective-specific default lives on its objective class, so the
choice is made in one place. A `preset` (contract.presets) fills what the spec leaves out with
one of the paper's two testbeds; an explicit field always wins.

Batch units are the paper's: DPO counts pairs, KTO examples, GRPO *sequences* (a group of G
counts G), so the three objectives see the same data per step on the same file.
`JobSpec.resolved()` is the one place every default becomes a value: the API stores and
returns it, and the trainer prints it when it starts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

from contract.evaluation import EvalRequest
from contract.humanline_params import HumanlineParams
from contract.online_async import AsyncFields, async_refusal
from contract.parallel import ParallelConfig, Parallelism
from contract.presets import PRESETS, PresetName, lay_over, preset_values
from contract.rewards import MATH_REWARDS, REWARD_NAMES, RewardSpec
from contract.sft_spec import SFTConfig, sft_refusal
from contract.strict import StrictNumbers
from contract.sync import ReferenceSync, SyncPolicy
from contract.vllm import VLLMConfig

ObjectiveName = Literal["sft", "dpo", "kto", "grpo"]
DataSource = Literal["offline", "online"]
Schedule = Literal["constant_with_warmup", "linear", "cosine", "constant"]
ActivationCheckpointing = Literal["off", "on", "auto"]
CompileMode = Literal["off", "on", "auto"]
# `compile: auto` per device type: on only where the GPU proof measured it faster (none yet).
COMPILE_BY_DEFAULT: dict[str, bool] = {"cpu": False, "cuda": False}
INT4_MAX = 2**31 - 1  # hard bound: step counts are stored in PostgreSQL integer columns
VARIANTS = ("offline", "online", "offline+humanline", "online+humanline")


def variant_of(spec: Mapping[str, Any]) -> str:
    """A (stored, JSON) spec's variant, as JobSpec.variant names it."""
    source = str(spec.get("data_source") or "offline")
    return source + ("+humanline" if spec.get("humanline") else "")


class _Strict(StrictNumbers):
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
        None,
        gt=0,
        lt=1,
        description="PPO clip range; default 0.5 only when the "
        "reference never moves (offline, reference_sync 'none'), else 0.15.",
    )
    trains_on: ClassVar[tuple[str, ...]] = ("preference",)
    default_lr: ClassVar[float] = 5e-6
    default_batch_size: ClassVar[int] = 64  # sequences: 32 offline pairs (groups of two)


Objective = Annotated[SFTConfig | DPOConfig | KTOConfig | GRPOConfig, Field(discriminator="name")]


class OptimConfig(_Strict):
    """AdamW with a linear warm-up over `warmup_ratio` of the steps, then `schedule`: constant
    by default, as both of the authors' codebases run (HALOs; open-r1-humanline's
    ``lr_scheduler_type: constant_with_warmup``). lr defaults to the objective's paper value."""

    lr: float | None = Field(None, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    schedule: Schedule = Field(
        "constant_with_warmup",
        description="After warm-up: constant (default), or linear/cosine decay to 0; "
        "'constant' has no warm-up.",
    )
    max_grad_norm: float = Field(1.0, gt=0)


class AdapterConfig(_Strict):
    kind: Literal["none", "lora"] = "none"
    r: int = Field(16, ge=1)
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )


class OnlineConfig(AsyncFields, _Strict):
    """Round-based online data (paper, Algorithm 1): every `sample_every` steps, sample
    `num_samples` completions per prompt from the current policy, score them, and train the
    next `sample_every` steps on what survives the τ filter. `mode`, `lag`, `is_cap` and
    `sampler_threads` (contract.online_async) sample asynchronously, beside the trainer."""

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
    zero_variance_groups: Literal["drop", "keep"] = Field(
        "drop",
        description="GRPO: 'drop' groups whose score spread is below tau (zero-variance "
        "ones among them); "
        "'keep' trains on every group, as the paper's math setup does (the math preset).",
    )
    divide_logits_by_temperature: bool = Field(
        False,
        description="Score log-probs of logits / temperature, the distribution sampled from "
        "(the authors' math code does; the math preset).",
    )
    engine: Literal["auto", "vllm", "hf"] = "auto"
    prompt_budget: float = Field(
        4.0, ge=1, description="Most prompts a round samples, as a multiple of those it needs."
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="vLLM engine settings.")

    @model_validator(mode="after")
    def _temperature(self) -> OnlineConfig:
        if self.divide_logits_by_temperature and self.temperature <= 0:
            raise ValueError("divide_logits_by_temperature needs temperature > 0")
        return self

    @field_validator("rewards")
    @classmethod
    def _registered(cls, rewards: list[RewardSpec]) -> list[RewardSpec]:
        for r in rewards:
            if r.name not in REWARD_NAMES:
                known = ", ".join(sorted(REWARD_NAMES))
                raise ValueError(f"unknown reward {r.name!r}; registered: {known}")
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
    preset: PresetName = Field(
        "instruction",
        description="The paper's testbed whose defaults fill what the spec leaves out: "
        "'instruction' "
        "or 'math' (contract.presets); an explicit field always wins.",
    )
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
    batch_size: int | None = Field(
        None,
        ge=1,
        description="Global batch in the paper's units: DPO pairs, KTO examples, GRPO sequences "
        "(a group of G counts G; a multiple of the group size).",
    )
    grad_accum: int | None = Field(
        None,
        ge=1,
        le=INT4_MAX,
        description="Micro-steps per optimizer step. Unset (the default): the trainer picks "
        "the largest micro-batch that fits the memory it has (contract.micro_batch) "
        "and halves it on an out-of-memory error; set: used as given.",
    )
    max_steps: int | None = Field(None, ge=1, le=INT4_MAX)
    epochs: int = Field(1, ge=1, le=INT4_MAX)
    max_prompt_length: int = Field(512, ge=1)
    max_length: int = Field(1024, ge=2, description="Prompt + completion tokens.")
    seed: int = Field(0, ge=-(2**63), le=2**63 - 1, description="Any signed 64-bit integer.")
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    adapter: AdapterConfig = Field(default_factory=AdapterConfig)
    checkpoint_every: int = Field(
        0, ge=0, le=INT4_MAX, description="Steps between checkpoints; 0 = end only."
    )
    evaluations: list[EvalRequest] = Field(
        default_factory=list,
        max_length=8,
        description="Evaluations to run on the final model when the job succeeds (service only).",
    )
    max_runtime: float | None = Field(
        None,
        gt=0,
        description="Wall-clock limit in seconds, all attempts together (service only): past "
        "it the job checkpoints and fails. Default and cap: the operator's.",
    )
    log_every: int = Field(1, ge=1, le=INT4_MAX)
    quality_sample: int = Field(256, ge=0, description="Examples scored for the data signal.")
    metadata: dict[str, str] = Field(default_factory=dict)
    activation_checkpointing: ActivationCheckpointing = Field(
        "auto",
        description="Recompute each decoder layer's activations in backward: 'on', 'off', or "
        "'auto' (on when it lets a larger micro-batch fit and the one without it holds "
        "fewer than contract.micro_batch.AUTO_UNCHECKPOINTED_TOKENS tokens).",
    )
    compile: CompileMode = Field(
        "auto",
        description="torch.compile each decoder layer (regional): 'on', 'off', or 'auto' (on "
        "where it measured faster: contract.spec.COMPILE_BY_DEFAULT); a compile failure falls "
        "back to eager with a warning.",
    )
    parallelism: Parallelism = Field(
        default_factory=ParallelConfig, description="ddp or fsdp (contract.parallel)."
    )

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
        objective = data.get("objective")
        name = (
            objective.get("name", "dpo")
            if isinstance(objective, dict)
            else getattr(objective, "name", None)
        )
        preset = data.get("preset", "instruction")
        if preset not in PRESETS:
            return data  # the field's own validation names it
        base = preset_values(preset, name, data.get("data_source", "offline"))
        return lay_over(base, data) if base else data

    @model_validator(mode="after")
    def _check(self) -> JobSpec:
        if self.objective.name == "sft" and (
            why := sft_refusal(self.humanline, self.data_source, self.online, self.reference_sync)
        ):
            _field_error(why[0], why[1], self.variant if why[0] == "variant" else self.data_source)
        if self.max_prompt_length >= self.max_length:
            raise ValueError("max_prompt_length must be smaller than max_length")
        if self.data_source == "online" and self.max_steps is None:
            raise ValueError("online jobs need max_steps (their data is sampled as they train)")
        if self.data_source == "online" and self.online is None:
            self.online = OnlineConfig()
        if self.data_source == "offline" and self.online is not None:
            raise ValueError("'online' settings need data_source 'online'")
        p = self.parallelism
        if why := async_refusal(self.objective.name, self.online, p.nodes, p.strategy):
            _field_error(why[0], why[1], getattr(self, why[0]))
        if self.humanline and getattr(self.objective, "reference_free", False):
            raise ValueError("humanline needs a reference model; reference_free DPO has none")
        if self.global_batch_size % self.group_size:
            _field_error(
                "batch_size",
                f"batch_size counts sequences for GRPO and must be a multiple of the group "
                f"size {self.group_size}; got {self.global_batch_size}",
                self.global_batch_size,
            )
        if self.grad_accum is not None and self.examples_per_batch % self.grad_accum:
            _field_error(
                "batch_size",
                f"batch_size must be divisible by grad_accum: {self.examples_per_batch} "
                f"{self.batch_unit} per batch, grad_accum {self.grad_accum}",
                self.global_batch_size,
            )
        return self

    # --- resolved values: the one place each default is decided -------------------------
    @property
    def variant(self) -> str:
        return variant_of({"data_source": self.data_source, "humanline": self.humanline})

    @property
    def sync(self) -> ReferenceSync:
        if self.reference_sync is not None:
            return self.reference_sync
        return "humanline" if self.humanline else "none"

    @property
    def sync_policy(self) -> SyncPolicy:
        """When the reference moves (contract.sync): every site that syncs asks this."""
        return SyncPolicy(self.sync, self.humanline_params.sync_every, self.data_source == "online")

    @property
    def training_formats(self) -> tuple[str, ...]:
        """Training-file formats this job can learn from (online jobs sample from prompts)."""
        return ("prompt",) if self.data_source == "online" else self.objective.trains_on

    @property
    def needs_reference(self) -> bool:
        """Whether the loss compares the policy with a reference model (SFT's does not)."""
        return getattr(self.objective, "needs_reference", True)

    @property
    def rows_per_example(self) -> int:
        """Sequences scored with a graph per training example: a DPO pair 2, a GRPO group G,
        a KTO or SFT example 1 (KTO's mismatched rows are scored without a graph)."""
        return 2 if self.objective.name == "dpo" else self.group_size

    @property
    def lr(self) -> float:
        return self.optim.lr if self.optim.lr is not None else self.objective.default_lr

    @property
    def global_batch_size(self) -> int:
        return self.batch_size if self.batch_size is not None else self.objective.default_batch_size

    @property
    def logps_temperature(self) -> float:
        """Logits ÷ this when scoring log-probs: the sampling temperature if asked (online),
        else 1."""
        if self.online is not None and self.online.divide_logits_by_temperature:
            return self.online.temperature
        return 1.0

    @property
    def batch_unit(self) -> str:
        names = {"sft": "examples", "dpo": "pairs", "kto": "examples", "grpo": "sequences"}
        return names[self.objective.name]

    @property
    def group_size(self) -> int:
        """Sequences per training example: GRPO's G (offline pairs and `extremes`: 2), else 1."""
        if self.objective.name != "grpo":
            return 1
        return (
            self.online.num_samples
            if self.online is not None and self.online.grpo_keep == "all"
            else 2
        )

    @property
    def examples_per_batch(self) -> int:
        """Training examples (pairs, examples, groups) per optimizer step: what the plan batches."""
        return self.global_batch_size // self.group_size

    def examples_in(self, fmt: str, records: int) -> int:
        """Training examples from `records` records, before any is dropped (KTO splits pairs)."""
        return 2 * records if self.objective.name == "kto" and fmt == "preference" else records

    def total_steps(self, n_examples: int) -> int:
        """Optimizer steps: `max_steps`, else whole batches per epoch × epochs."""
        return self.max_steps or max(1, n_examples // self.examples_per_batch) * self.epochs

    def compiles_on(self, device_type: str) -> bool:
        """Whether the decoder layers are compiled on this device type (`compile`)."""
        if self.compile == "auto":
            return COMPILE_BY_DEFAULT.get(device_type, False)
        return self.compile == "on"

    @property
    def grpo_epsilon(self) -> float:
        """ε: 0.5 only when the reference never moves (plain offline GRPO), else 0.15 (Table
        tab:obj_if: ε "needs to be much larger when the reference model is fixed")."""
        eps = getattr(self.objective, "epsilon", None)
        if eps is not None:
            return eps
        return 0.15 if self.sync_policy.moves else 0.5

    def resolved(self) -> JobSpec:
        """This spec with every default made a value (lr, batch size, reference sync, GRPO ε; the
        preset is applied at validation). Idempotent, so storing it changes nothing about the
        run."""
        data = self.model_dump()
        data["optim"]["lr"] = self.lr
        data["batch_size"] = self.global_batch_size
        data["reference_sync"] = self.sync
        if self.objective.name == "grpo":
            data["objective"]["epsilon"] = self.grpo_epsilon
        if self.online is not None and self.online.mode == "async":
            data["online"]["lag"] = self.online.resolved_lag
        return JobSpec.model_validate(data)

    def summary(self, total_steps: int | None = None) -> dict[str, Any]:
        """The headline resolved values, for the trainer's start event and people."""
        return {
            "preset": self.preset,
            "variant": self.variant,
            "objective": self.objective.name,
            "lr": self.lr,
            "batch_size": self.global_batch_size,
            "batch_unit": self.batch_unit,
            "group_size": self.group_size,
            "examples_per_batch": self.examples_per_batch,
            "total_steps": total_steps if total_steps is not None else self.max_steps,
            "epsilon": self.grpo_epsilon if self.objective.name == "grpo" else None,
            "schedule": self.optim.schedule,
            "warmup_ratio": self.optim.warmup_ratio,
            "reference_sync": self.sync,
            "sync_every": self.humanline_params.sync_every,
            **(self.online.async_summary() if self.online is not None else {}),
        }


def _field_error(field: str, message: str, value: Any) -> None:
    """Raise a validation error located at `field` (a model-level check names the field it is
    about)."""
    raise ValidationError.from_exception_data(
        "JobSpec",
        [
            InitErrorDetails(
                type=PydanticCustomError("value_error", message), loc=(field,), input=value
            )
        ],
    )


def load_spec(path: str | Path) -> JobSpec:
    """Read a spec from YAML or JSON; raises pydantic.ValidationError with field paths."""
    import yaml

    text = Path(path).read_text()
    data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    return JobSpec.model_validate(data)
