"""Presets: the paper's two testbeds as named bundles of defaults (DESIGN.md §2).

A preset only fills what the spec leaves out: the spec's own fields are laid *over* the
preset's values before validation, so an explicit field always wins.

- ``instruction`` (the default): the paper's instruction-following setup (Llama3-8B,
  UltraFeedback; Table ``tab:hyperparams`` and ``tab:obj_if``). Its values are the field
  defaults themselves (objective classes for lr, β and batch size), so it adds nothing.
- ``math``: the paper's mathematical-reasoning GRPO setup (Qwen2.5-1.5B on Open-R1;
  Table ``tab:hyperparams_math``) and the authors' recipe
  ``kawine/open-r1-humanline``, ``recipes/Qwen2.5-1.5B-Instruct/grpo/``
  ``config_humanline_64_150_150_12_1e-6.yaml``:
  lr 1e-6, batch 256 sequences (groups of 8 included), AdamW ε 1e-8, weight decay 0,
  β_KL 1e-4, humanline k = 12 (the paper's range is [12, 24]; k = 1 collapses there),
  max 512 prompt + 2048 completion tokens; online sampling with temperature 0.7, top-p 1.0,
  the tag_count/format/accuracy rewards weighted 1/1/8, every group kept (TRL's GRPO trainer,
  which the authors' math code subclasses, filters none) and logits divided by the sampling
  temperature in the log-probs (the authors' ``_get_per_token_logps_and_entropies``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from contract.rewards import MATH_REWARDS

PresetName = Literal["instruction", "math"]
PRESETS: tuple[str, ...] = ("instruction", "math")


def preset_values(name: str, objective: str | None, data_source: str | None) -> dict[str, Any]:
    """The preset's fields as spec input (nested dicts), for this objective and data source."""
    if name == "instruction":
        return {}
    if name != "math":
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}")
    values: dict[str, Any] = {
        "optim": {"lr": 1e-6, "eps": 1e-8, "weight_decay": 0.0},
        "batch_size": 256,
        "humanline_params": {"sync_every": 12},
        "max_prompt_length": 512,
        "max_length": 512 + 2048,
    }
    if objective == "grpo":
        values["objective"] = {"name": "grpo", "beta_kl": 1e-4}
    if data_source == "online":
        values["online"] = {
            "num_samples": 8,
            "temperature": 0.7,
            "top_p": 1.0,
            "max_new_tokens": 2048,
            "rewards": [r.model_dump() for r in MATH_REWARDS],
            "grpo_keep": "all",
            "zero_variance_groups": "keep",
            "divide_logits_by_temperature": True,
        }
    return values


def _explicit(value: Any) -> Any:
    """A model instance given in Python → the fields that were set (and its discriminator)."""
    if isinstance(value, BaseModel):
        out = value.model_dump(exclude_unset=True)
        if "name" in type(value).model_fields:
            out["name"] = value.name  # type: ignore[attr-defined]
        return out
    return value


def lay_over(base: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """`data` laid over `base`, recursively for nested dicts: what `data` sets wins (an explicit
    null means "the default", so the preset's value stays)."""
    out = dict(base)
    for key, value in data.items():
        if value is None and key in base:
            continue
        value = _explicit(value) if isinstance(base.get(key), dict) else value
        if isinstance(out.get(key), dict) and isinstance(value, dict):
            out[key] = lay_over(out[key], value)
        else:
            out[key] = value
    return out
