"""The shapes of request parameters: TypedDicts the SDK's methods take, every key optional
(the server fills in the paper's defaults), held to the server's schema by
tests/client/test_spec_keywords.py. `humanline_client.types` re-exports every name."""

from __future__ import annotations

from typing import Any, Literal, Optional, TypedDict, Union  # Python >= 3.9

__all__ = [
    "AdapterParams",
    "EvaluationKind",
    "EvaluationParams",
    "GenerationParams",
    "HumanlineParams",
    "JudgeParams",
    "Objective",
    "ObjectiveParams",
    "OnlineParams",
    "OpenAIJudgeParams",
    "OptimParams",
    "ParallelParams",
    "RewardModelJudgeParams",
    "RewardParams",
    "VLLMParams",
]

Objective = Literal["sft", "dpo", "kto", "grpo"]
EvaluationKind = Literal["instruction", "math"]


class ObjectiveParams(TypedDict, total=False):
    name: Objective
    packing: bool  # SFT: short examples share a row (no attention across them)
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
    M_P: Union[float, Literal["batch_max"]]
    M_R: Union[float, Literal["batch_max"]]
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
    schedule: Literal["constant_with_warmup", "linear", "cosine", "constant"]
    max_grad_norm: float


class AdapterParams(TypedDict, total=False):
    kind: Literal["none", "lora"]
    r: int
    alpha: float
    dropout: float
    target_modules: list[str]


class RewardParams(TypedDict, total=False):
    """One registered reward source of an online job: {"name": "math_accuracy", "weight": 8}."""

    name: str
    weight: float
    options: dict[str, Any]


class VLLMParams(TypedDict, total=False):
    """The vLLM engine of online sampling (server defaults: the spec's lengths and precision)."""

    max_model_len: Optional[int]
    dtype: Literal["auto", "bfloat16", "float16", "float32"]
    gpu_memory_utilization: float
    kv_cache_gib: Optional[float]
    sleep_between_rounds: bool
    enforce_eager: bool


class ParallelParams(TypedDict, total=False):
    """How a multi-process job spreads: {"strategy": "fsdp"} shards it (FSDP2); several nodes:
    {"nodes": 2, "processes_per_node": 8, "strategy": "fsdp", "hsdp": True}."""

    strategy: Literal["ddp", "fsdp"]
    reshard_after_forward: bool
    nodes: int
    processes_per_node: int
    hsdp: bool


class OnlineParams(TypedDict, total=False):
    """Online sampling (variant "online" / "online+humanline"); unset keys take the paper's
    defaults (rewards: tag_count 1, format 1, math_accuracy 8). mode "async": a sampler process
    samples step t's batch with the policy of step max(1, t - lag) (docs/async.md)."""

    rewards: list[RewardParams]
    num_samples: int
    temperature: float
    top_p: float
    max_new_tokens: int
    tau: float
    sample_every: int
    grpo_keep: Literal["all", "extremes"]
    zero_variance_groups: Literal["drop", "keep"]
    divide_logits_by_temperature: bool
    engine: Literal["auto", "vllm", "hf"]
    prompt_budget: float
    vllm: VLLMParams
    mode: Literal["sync", "async"]
    lag: Optional[int]
    is_cap: Optional[float]  # async GRPO: truncated importance weight against the sampler
    sampler_threads: Optional[int]


class OpenAIJudgeParams(TypedDict, total=False):
    """An OpenAI-compatible endpoint the operator allows (EVAL_JUDGE_BASE_URLS); the server
    uses its own API key for it."""

    type: Literal["openai"]
    base_url: str
    model: str


class RewardModelJudgeParams(TypedDict, total=False):
    """A reward model by the name the operator configured (EVAL_REWARD_MODELS)."""

    type: Literal["reward_model"]
    model: str


JudgeParams = Union[OpenAIJudgeParams, RewardModelJudgeParams]


class GenerationParams(TypedDict, total=False):
    """Sampling; unset keys take the kind's defaults (instruction: one greedy answer of up to
    512 tokens; math: n=4 at temperature 0.7, top-p 0.95, 1024 tokens)."""

    n: int  # math only
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int


class EvaluationParams(TypedDict, total=False):
    """An evaluation a job runs on its final model when it succeeds (`jobs.create(...,
    evaluations=[{"file_id": ..., "kind": "math"}])`); the fields of `evaluations.create`."""

    file_id: str
    kind: EvaluationKind
    judge: JudgeParams
    generation: GenerationParams
    prompt_template: str
    system_prompt: str
    max_items: int
