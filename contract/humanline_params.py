"""Humanline's parameters (DESIGN.md §2), a section of the job spec (contract.spec re-exports
it: `from contract.spec import HumanlineParams` keeps working)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from contract.strict import StrictNumbers


class HumanlineParams(StrictNumbers):
    """Humanline clipping/sampling and syncing parameters (DESIGN.md §2).

    ``mode: clip`` (default) clamps each token's log-ratio to [log_eps_P, log_eps_R]; ``mode:
    sample`` rejects token t when ``π/π_ref < M_P·B_P`` or ``π_ref/π < M_R·B_R``, B ~ Beta(γ, β),
    with the authors' defaults (HALOs ``get_humanline_mask``): M = the micro-batch's largest ratio
    (``batch_max``), γ_P 0.5, γ_R 0.01, β 1. log_eps_P/R play no part in sample mode; clip is its
    k → ∞ limit (trainer.losses.humanline says how to sample around a clip range).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    log_eps_P: float = Field(
        -1.5, description="Lower clamp of the token log-ratio (log ε_P); clip mode."
    )
    log_eps_R: float = Field(
        1.5, description="Upper clamp of the token log-ratio (log ε_R); clip mode."
    )
    sync_every: int = Field(1, ge=1, description="k: sync the reference every k optimizer steps.")
    mode: Literal["clip", "sample"] = "clip"
    # Humanline sampling: reject token t when π/π_ref < M_P·B_P or π_ref/π < M_R·B_R.
    M_P: float | Literal["batch_max"] = Field(
        "batch_max", description="Bound on π/π_ref: a number or 'batch_max'."
    )
    M_R: float | Literal["batch_max"] = Field(
        "batch_max", description="Bound on π_ref/π: a number or 'batch_max'."
    )
    gamma_P: float = Field(0.5, gt=0)
    beta_P: float = Field(1.0, gt=0)
    gamma_R: float = Field(0.01, gt=0)
    beta_R: float = Field(1.0, gt=0)

    @field_validator("M_P", "M_R")
    @classmethod
    def _positive(cls, m: float | str) -> float | str:
        if isinstance(m, float) and not m > 0:
            raise ValueError("must be > 0 or 'batch_max'")
        return m

    @model_validator(mode="after")
    def _range(self) -> HumanlineParams:
        if not self.log_eps_P < self.log_eps_R:
            raise ValueError(
                f"log_eps_P ({self.log_eps_P}) must be below log_eps_R ({self.log_eps_R})"
            )
        return self
