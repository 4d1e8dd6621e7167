"""``string_check``: OpenAI's string-check grader as a registered reward.

The options are OpenAI's grader fields: ``input`` and ``reference`` templates rendered for each
sample (``{{sample.output_text}}`` the completion, ``{{item.<field>}}`` a field of its training
line; see ``contract.graders``) and an ``operation``: ``eq`` / ``ne`` (equal / not equal),
``like`` (the input contains the reference) and ``ilike`` (the same, ignoring case). The short
form ``field="answer"`` compares the whole completion with that field. The score is 1.0 when
the check holds, else 0.0. Surrounding whitespace of the completion and of both rendered sides
is ignored, as a model's trailing newline is not a wrong answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from contract.graders import OPERATIONS, render, string_check
from contract.rewards import string_check_templates

__all__ = ["OPERATIONS", "StringCheck", "check"]


def check(operation: str, output: str, reference: str) -> bool:
    return string_check(operation, output.strip(), reference.strip())


class StringCheck:
    def __init__(
        self,
        operation: str = "eq",
        field: str | None = None,
        input: str | None = None,
        reference: str | None = None,
    ):
        options: dict[str, Any] = {"operation": operation}
        if field is not None or reference is None:
            options["field"] = field or "answer"
        for key, value in (("input", input), ("reference", reference)):
            if value is not None:
                options[key] = value
        self.operation = operation
        self.input, self.reference = string_check_templates(options)  # ValueError if bad

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[str], records: Sequence[dict]
    ) -> list[float]:
        scores = []
        for text, record in zip(completions, records, strict=True):
            text = text.strip()
            try:
                left = render(self.input, text, record)
                right = render(self.reference, text, record)
            except KeyError as missing:
                raise ValueError(
                    f"string_check reads {{{{{missing.args[0]}}}}}, which a training line lacks"
                ) from None
            scores.append(1.0 if check(self.operation, left, right) else 0.0)
        return scores
