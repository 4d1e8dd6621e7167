"""The SFT objective's spec: its config class and what a job with it may not ask for.

Kept beside contract.spec (which imports both) so the job spec stays one readable module.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field

from contract.strict import StrictNumbers


class SFTConfig(StrictNumbers):
    """Supervised fine-tuning: the mean negative log-likelihood of the completion (assistant)
    tokens over the whole global batch. No reference model, so no humanline and no online
    sampling (JobSpec refuses both, naming the field: `sft_refusal`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: Literal["sft"] = "sft"
    packing: bool = Field(
        False,
        description="Pack short examples into rows of up to max_length tokens; no attention "
        "crosses examples (position ids restart, the mask is per example), so the loss is the "
        "unpacked one.",
    )
    trains_on: ClassVar[tuple[str, ...]] = ("sft",)
    default_lr: ClassVar[float] = 2e-5  # TRL's SFT default; OpenAI's multiplier scales it
    default_batch_size: ClassVar[int] = 32
    needs_reference: ClassVar[bool] = False


def sft_refusal(
    humanline: bool, data_source: str, online: Any, reference_sync: str | None
) -> tuple[str, str] | None:
    """(field, why) when an SFT job asks for what needs a reference model or sampled data:
    the humanline variants clip the policy's log-ratio to a reference, online sampling trains
    on scored samples; None when it asks for neither."""
    if humanline:
        return (
            "variant",
            "sft has no humanline variant: humanline clips each token's log-ratio against a "
            "reference model and supervised fine-tuning has none; use variant 'offline'",
        )
    if data_source == "online" or online is not None:
        return (
            "online",
            "sft trains on the completions of its training file: online sampling (data_source "
            "'online', 'online' settings) needs a preference objective (dpo, kto or grpo)",
        )
    if reference_sync not in (None, "none"):
        return (
            "reference_sync",
            "sft has no reference model to sync; leave reference_sync unset or 'none'",
        )
    return None
