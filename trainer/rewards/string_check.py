"""``string_check``: OpenAI's string-check grader as a registered reward.

Compares the whole completion (OpenAI's ``{{sample.output_text}}``) with a column of the
training record (``{{item.answer}}`` by default): 1.0 when the check holds, else 0.0. The
operations are OpenAI's: ``eq`` / ``ne`` (equal / not equal), ``like`` (the reference occurs
in the completion) and ``ilike`` (the same, ignoring case). Surrounding whitespace is ignored,
as a model's trailing newline is not a wrong answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

OPERATIONS = ("eq", "ne", "like", "ilike")


def check(operation: str, output: str, reference: str) -> bool:
    output, reference = output.strip(), reference.strip()
    if operation == "eq":
        return output == reference
    if operation == "ne":
        return output != reference
    if operation == "like":
        return reference in output
    return reference.lower() in output.lower()  # ilike


class StringCheck:
    def __init__(self, operation: str = "eq", field: str = "answer"):
        if operation not in OPERATIONS:
            raise ValueError(f"string_check operation must be one of {', '.join(OPERATIONS)}")
        self.operation, self.field = operation, field

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[str], records: Sequence[dict]
    ) -> list[float]:
        scores = []
        for text, record in zip(completions, records, strict=True):
            if self.field not in record:
                raise ValueError(f"string_check needs the column {self.field!r} in every record")
            scores.append(1.0 if check(self.operation, text, str(record[self.field])) else 0.0)
        return scores
