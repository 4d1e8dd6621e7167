"""OpenAI's grader templates: ``{{ namespace.variable }}`` in a grader's ``input`` and
``reference``, read (the API checks them when a job is created) and rendered (the trainer
renders them for every sample). Pure Python: shared by the API and the trainer.

Two namespaces, as OpenAI's: ``item`` is the training line (its fields besides ``messages``;
``{{item.meta.id}}`` reads a nested field) and ``sample`` the sampled completion, of which
only ``{{sample.output_text}}`` exists here (no structured outputs, tools, audio or choices).
A value that is not a string renders as its JSON (``4`` → ``4``, ``true`` → ``true``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

TEMPLATE = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
SAMPLE_TEXT = "sample.output_text"
OPERATIONS = ("eq", "ne", "like", "ilike")


class TemplateError(ValueError):
    """A template names a variable this service cannot fill (the message says which)."""


def variables(template: str) -> list[str]:
    """The variables a template names, in order (``["sample.output_text", "item.answer"]``);
    TemplateError for one outside ``item.*`` and ``sample.output_text``."""
    found = []
    for match in TEMPLATE.finditer(template):
        name = match.group(1)
        if not _PATH.match(name) or "." not in name:
            raise TemplateError(
                f"{match.group(0)!r} is not a template variable: write "
                "{{item.<field>}} or {{sample.output_text}}"
            )
        namespace = name.split(".", 1)[0]
        if namespace == "sample" and name != SAMPLE_TEXT:
            raise TemplateError(
                f"{match.group(0)!r} is not supported: of the sample, only "
                "{{sample.output_text}} (the completion's text) is graded here"
            )
        if namespace not in ("item", "sample"):
            raise TemplateError(
                f"{match.group(0)!r}: unknown namespace {namespace!r}; templates read "
                "{{item.<field>}} (the training line) and {{sample.output_text}}"
            )
        found.append(name)
    return found


def item_fields(*templates: str) -> list[str]:
    """The training line's top-level fields the templates read (each once, in order): what
    every line of the file must hold for the grader to render."""
    out: list[str] = []
    for template in templates:
        for name in variables(template):
            if name.startswith("item."):
                top = name.split(".")[1]
                if top not in out:
                    out.append(top)
    return out


def item_paths(*templates: str) -> list[str]:
    """The item paths the templates read, nested ones whole (``{{item.meta.id}}`` →
    ``"meta.id"``), each once, in order: what every line must hold for the grader to render."""
    out: list[str] = []
    for template in templates:
        for name in variables(template):
            if name.startswith("item.") and (path := name[len("item.") :]) not in out:
                out.append(path)
    return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _lookup(item: Mapping[str, Any], path: list[str]) -> Any:
    value: Any = item
    for i, key in enumerate(path):
        if not isinstance(value, Mapping) or value.get(key) is None:
            raise KeyError("item." + ".".join(path[: i + 1]))
        value = value[key]
    return value


def render(template: str, output_text: str, item: Mapping[str, Any]) -> str:
    """The template with every variable replaced; KeyError naming the variable when the item
    lacks it (or holds null there)."""

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == SAMPLE_TEXT:
            return output_text
        return _text(_lookup(item, name.split(".")[1:]))

    variables(template)  # refuses what `fill` could not read
    return TEMPLATE.sub(fill, template)


def string_check(operation: str, input: str, reference: str) -> bool:
    """OpenAI's string_check: ``eq`` / ``ne`` (case-sensitive (in)equality), ``like`` (the
    input contains the reference, case-sensitive) and ``ilike`` (contains, ignoring case)."""
    if operation == "eq":
        return input == reference
    if operation == "ne":
        return input != reference
    if operation == "like":
        return reference in input
    if operation == "ilike":
        return reference.lower() in input.lower()
    raise ValueError(f"string_check operation must be one of {', '.join(OPERATIONS)}")
