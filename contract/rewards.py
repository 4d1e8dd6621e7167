"""How a job names its reward sources. The sources themselves (code) live in
``trainer.rewards.registry``, keyed by exactly these names (a test holds the two together)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, model_validator

from contract.graders import OPERATIONS, SAMPLE_TEXT, item_fields, item_paths, variables
from contract.strict import StrictNumbers

# The only reward sources a job may name: no user code ever runs in a worker.
REWARD_NAMES: frozenset[str] = frozenset(
    {"math_accuracy", "format", "tag_count", "reward_model", "string_check"}
)


class RewardSpec(StrictNumbers):
    """One source of the job's reward: ``{"name": "math_accuracy", "weight": 8}``.

    ``options`` are the factory's keyword arguments (e.g. ``{"path": ...}`` for
    ``reward_model``); they are checked when the source is built.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, examples=["math_accuracy"])
    weight: float = Field(1.0, description="Multiplier in the weighted sum; may be negative.")
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _string_check(self) -> RewardSpec:
        if self.name == "string_check":
            string_check_templates(self.options)  # a bad template is refused with the spec
        return self

    def item_fields(self) -> list[str]:
        """The training line's fields this source reads (every line must hold them): the
        job is refused at creation when the file has a line without one."""
        if self.name == "string_check":
            return item_fields(*string_check_templates(self.options))
        return []

    def item_paths(self) -> list[str]:
        """The item paths this source reads, nested ones whole (``meta.id``): admission
        refuses a job whose file has a line without one."""
        if self.name == "string_check":
            return item_paths(*string_check_templates(self.options))
        return []


def string_check_templates(options: dict[str, Any]) -> tuple[str, str]:
    """``(input, reference)`` of a string_check source's options: OpenAI's templates
    (``{"input": "{{sample.output_text}}", "reference": "{{item.answer}}", "operation": ...}``)
    or our short form ``{"field": "answer"}`` (the whole completion against that field).
    ValueError, naming what to change, for anything else."""
    operation = options.get("operation", "eq")
    if operation not in OPERATIONS:
        raise ValueError(
            f"string_check operation {operation!r} is not one of {', '.join(OPERATIONS)}"
        )
    extra = options.keys() - {"operation", "field", "input", "reference"}
    if extra:
        raise ValueError(f"string_check has no option {sorted(extra)[0]!r}")
    if "field" in options:
        if "input" in options or "reference" in options:
            raise ValueError("string_check takes 'field' or 'input'/'reference', not both")
        field = options["field"]
        if not isinstance(field, str) or not field.isidentifier():
            raise ValueError("string_check option 'field' must be a column name")
        return "{{" + SAMPLE_TEXT + "}}", "{{item." + field + "}}"
    templates = options.get("input", "{{" + SAMPLE_TEXT + "}}"), options.get("reference")
    if not all(isinstance(t, str) for t in templates):
        raise ValueError("string_check needs 'reference' (and 'input') as template strings")
    names = [name for t in templates for name in variables(t)]  # type: ignore[arg-type]
    if SAMPLE_TEXT not in names:
        raise ValueError(
            "string_check must read the completion: put {{sample.output_text}} in its "
            "input (or reference)"
        )
    return templates  # type: ignore[return-value]


# The paper's math setup (Open-R1 rewards, weighted 1/1/8 to emphasise accuracy).
MATH_REWARDS: tuple[RewardSpec, ...] = (
    RewardSpec(name="tag_count", weight=1.0),
    RewardSpec(name="format", weight=1.0),
    RewardSpec(name="math_accuracy", weight=8.0),
)
