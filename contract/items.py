"""OpenAI's reinforcement lines and the items in them.

A line is ``{"messages": [...], <the item's fields>}``: `reinforcement_prompt` validates it and
normalises it to the prompt format (contract.data calls it for a line with `messages` and no
`prompt`). `FieldProfile` records which lines hold which fields (the items graders read as
``{{item.<field>}}``) while a file is validated at upload; it is stored with the file's row, so
a job whose grader reads a field that some line lacks is refused at creation without reading
the file again.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from contract.records import RecordError
from contract.records import messages as _messages

MAX_PROFILED_FIELDS = 256  # item paths of a prompt file's first line whose presence is tracked
# Fields of a chat request that a prompt line cannot honour: the model would be sampled
# without them, silently (tool calling is not offered).
UNSUPPORTED_FIELDS = ("tools", "functions", "tool_choice", "parallel_tool_calls")


def _developer_as_system(messages: Any) -> Any:
    """OpenAI's `developer` role (its newer name for system instructions, common in files
    made for reasoning models) as the `system` turn chat templates know."""
    if not isinstance(messages, list):
        return messages
    return [
        {**m, "role": "system"} if isinstance(m, dict) and m.get("role") == "developer" else m
        for m in messages
    ]


def reinforcement_prompt(obj: dict) -> dict:
    """OpenAI's reinforcement line: `messages` is the conversation so far (system and user
    turns, maybe earlier assistant turns), the model writes the next assistant turn; every
    other field is the item that graders read (`{{item.<field>}}`). Returns the prompt
    record `{"prompt": messages, ...fields}`; RecordError naming the field otherwise."""
    for name in UNSUPPORTED_FIELDS:
        if name in obj:
            raise RecordError(
                name, "tool calling is not supported: remove it (prompts are plain chat)"
            )
    messages = _messages(_developer_as_system(obj["messages"]), "messages")
    if not any(m["role"] == "user" for m in messages):
        raise RecordError("messages", "has no user turn: add the user message the model answers")
    if messages[-1]["role"] == "assistant":
        raise RecordError(
            f"messages[{len(messages) - 1}].role",
            "the last turn is an assistant turn: reinforcement prompts end with the user "
            "turn the model answers (remove the answer from messages and put it in a field "
            "such as 'answer' for the grader); complete conversations are supervised data "
            "(OpenAI's method 'supervised')",
        )
    out = {key: value for key, value in obj.items() if key != "messages"}
    out["prompt"] = messages
    return out


_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # what a template path can name
MAX_PATH_DEPTH = 8


def _paths(record: dict) -> tuple[list[str], bool]:
    """The record's item paths holding a value (not null), nested objects walked, top-level
    first (breadth first), at most MAX_PROFILED_FIELDS; and whether that is all of them."""
    out: list[str] = []
    todo = deque((k, v) for k, v in record.items() if k != "prompt")
    while todo:
        path, value = todo.popleft()
        if value is None or not _KEY.match(path.rsplit(".", 1)[-1]):
            continue
        if len(out) == MAX_PROFILED_FIELDS:
            return out, False
        out.append(path)
        if isinstance(value, dict) and path.count(".") + 1 < MAX_PATH_DEPTH:
            todo.extend((f"{path}.{k}", v) for k, v in value.items() if isinstance(k, str))
    return out, True


def _get(record: dict, path: str) -> Any:
    value: Any = record
    for key in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


@dataclass
class FieldProfile:
    """Which lines of a prompt file hold which item paths, kept while the file is validated so
    a job can be refused when its grader reads a path some line lacks (``{{item.meta.id}}``
    included), without reading the file again. Only the first record's paths can be on every
    line, so only they are tracked, nested ones too, top-level first: `missing[p]` is the first
    line without path p (None: every line has it); a path the first record lacks is missing
    from `first_line`. A null value counts as absent. `complete` is False when the first
    record had more paths than are tracked (MAX_PROFILED_FIELDS): an untracked path then
    cannot be checked (`checkable`). Stored as JSON with the file's row (`as_json` /
    `from_json`); profiles stored before nested paths were tracked (`nested` False) know the
    top-level fields only."""

    first_line: int
    missing: dict[str, int | None]
    complete: bool = True
    nested: bool = True

    @classmethod
    def start(cls, record: dict, line: int) -> FieldProfile:
        tracked, complete = _paths(record)
        return cls(line, dict.fromkeys(tracked), complete=complete)

    def note(self, record: dict, line: int) -> None:
        for key, missing in self.missing.items():
            if missing is None and _get(record, key) is None:
                self.missing[key] = line

    def checkable(self, path: str) -> bool:
        if not self.nested:  # an old profile: checked as it always was
            return True
        return path in self.missing or path == "prompt" or self.complete

    def first_line_without(self, name: str) -> int | None:
        """The first line that lacks item path `name` (``answer``, ``meta.id``), or None when
        every line has it (or, past what is tracked, when that is not known: `checkable`).
        Every record has a prompt."""
        if not self.nested and name not in self.missing:
            name = name.split(".")[0]  # an old profile: the top-level field at least
        if name in self.missing:
            return self.missing[name]
        return None if name == "prompt" or not self.complete else self.first_line

    def as_json(self) -> dict[str, Any]:
        return {
            "first_line": self.first_line, "missing": self.missing, "complete": self.complete,
            "nested": self.nested,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Any) -> FieldProfile | None:
        """The stored profile, or None for a file stored without one (uploaded before
        profiles were kept, or not a prompt file)."""
        if not isinstance(data, dict) or not isinstance(data.get("missing"), dict):
            return None
        return cls(
            int(data.get("first_line", 1)),
            dict(data["missing"]),
            complete=bool(data.get("complete", True)),
            nested=bool(data.get("nested", False)),
        )
