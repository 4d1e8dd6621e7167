"""Asynchronous online training: the spec's `online.mode`, `online.lag` and what they allow.

With `mode: async` a sampler process runs beside the trainer, and the batch of step t is
sampled by *version* max(1, t − L) of the policy, version s being the weights that step s
trains (before its update). The lag is fixed, not "at most", so a run gives the same result
whatever the timing; L = 0 is the synchronous job. A round (`sample_every` S > 1) is sampled
whole by the version L steps before its first step: max(1, a − L) for the round starting at
step a, and trains on it for its S steps as a synchronous round does. docs/async.md draws the
schedule. Torch-free: the API, the worker and the trainer share it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

OnlineMode = Literal["sync", "async"]
MAX_LAG = 16  # the schema's bound; operators cap lower with ONLINE_MAX_LAG (models.settings)


def sampling_version(step: int, lag: int) -> int:
    """The policy version that samples the batch of `step` (the first step of its round)."""
    return max(1, step - lag)


class AsyncFields(BaseModel):
    """The async settings of `online` (contract.spec.OnlineConfig inherits them)."""

    mode: OnlineMode = Field(
        "sync",
        description="'sync': sample a round, then train it. 'async': a sampler process samples "
        "the next rounds while the trainer trains, lag steps behind (docs/async.md).",
    )
    lag: int | None = Field(
        None,
        ge=0,
        le=MAX_LAG,
        description="async: the batch of step t is sampled by the policy of step max(1, t − lag); "
        "default 1; 0 is the synchronous job.",
    )
    is_cap: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="async GRPO: weigh each token's surrogate by min(π_ref / π_sampler, is_cap), "
        "a truncated importance weight against the policy that sampled (off by default).",
    )
    sampler_threads: int | None = Field(
        None,
        ge=1,
        description="async on a CPU: threads of the sampler process (default: half the "
        "cores); the trainer keeps the rest.",
    )

    @model_validator(mode="after")
    def _async(self) -> Any:
        if self.mode == "sync":
            if self.lag:
                raise ValueError("online.lag needs online.mode 'async'")
            if self.is_cap is not None:
                raise ValueError("online.is_cap needs online.mode 'async'")
        return self

    @property
    def resolved_lag(self) -> int:
        """The lag the run uses: 0 when synchronous, 1 unless set when async."""
        if self.mode == "sync":
            return 0
        return 1 if self.lag is None else self.lag

    def async_summary(self) -> dict[str, Any]:
        """What the job object and the `started` event show: the resolved mode and lag, and
        which log-probs the ratio compares with (the sampler's, unprocessed: logits ÷ the job's
        log-prob temperature, never renormalised by top-p or top-k; docs/async.md)."""
        out: dict[str, Any] = {"online_mode": self.mode, "online_lag": self.resolved_lag}
        if self.is_async:
            out["online_behaviour_logprobs"] = "sampler, unprocessed (no top-p/top-k)"
        return out

    @property
    def is_async(self) -> bool:
        """Whether a sampler process runs beside the trainer (async with a lag > 0)."""
        return self.resolved_lag > 0


def async_refusal(
    objective: str, online: AsyncFields | None, nodes: int, strategy: str
) -> tuple[str, str] | None:
    """(field, reason) when the job cannot run asynchronously as asked, else None."""
    if online is None or online.mode == "sync":
        return None
    if objective not in ("grpo", "dpo"):
        return "online", f"online.mode 'async' trains grpo and dpo; not {objective}"
    if online.is_cap is not None and objective != "grpo":
        return "online", "online.is_cap weighs GRPO's surrogate; it needs objective grpo"
    if nodes > 1:
        return "parallelism", "online.mode 'async' runs on one node (one sampler process)"
    return None


# Operator knobs of the sampler process (environment; trainer.online.sampler_proc): the longest
# wait for one round before the job fails, and how many times a dead sampler is restarted.
SAMPLER_TIMEOUT_ENV = "HUMANLINE_SAMPLER_TIMEOUT"
SAMPLER_RESTARTS_ENV = "HUMANLINE_SAMPLER_RESTARTS"
DEFAULT_SAMPLER_TIMEOUT = 900.0
DEFAULT_SAMPLER_RESTARTS = 2
