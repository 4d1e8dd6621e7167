"""One JSONL record's field checks, shared by every training format's parser (contract.data,
contract.sft_data, contract.items): the error type that names a field, and the checks of
texts, roles and chat messages. Each check raises RecordError naming the field; `each` runs
several and raises all their errors together."""

from __future__ import annotations

import re
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
# A visible character: not whitespace, not a control or format character (C0/C1 controls,
# zero-width and direction marks, the BOM). A text without one is refused as empty.
VISIBLE = re.compile(r"[^\s\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u206f\ufeff]")


# A JSON escape of a UTF-16 surrogate: json.loads turns an unpaired one into a lone
# surrogate, text no tokenizer (nor UTF-8) can encode. Only lines holding one are walked.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class RecordError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class RecordErrors(RecordError):
    """Every error found in one record (a parser checks each field before giving up); reads
    as its first error where one is expected."""

    def __init__(self, errors: list[RecordError]):
        super().__init__(errors[0].field, errors[0].message)
        self.errors = errors


def each(*checks):
    """Run each check (a zero-argument callable); return their results, or raise every
    RecordError they raised together."""
    out, errors = [], []
    for check in checks:
        try:
            out.append(check())
        except RecordErrors as many:
            errors.extend(many.errors)
            out.append(None)
        except RecordError as err:
            errors.append(err)
            out.append(None)
    if errors:
        raise RecordErrors(errors)
    return out


def text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise RecordError(name, f"must be a string, got {type(value).__name__}")
    if VISIBLE.search(value) is None:  # usually found at the first character
        raise RecordError(name, "must not be empty (or only whitespace and control characters)")
    return value


def message_content(value: Any, name: str) -> str:
    """A message's content: a string, or OpenAI's list of content parts of which only text
    parts are accepted (`[{"type": "text", "text": ...}]`, joined by newlines, as vLLM joins
    them for a chat template); another part type is refused naming it."""
    if not isinstance(value, list):
        return text(value, name)
    if not value:
        raise RecordError(name, "must be a string or a non-empty list of text parts")
    texts = []
    for j, part in enumerate(value):
        where = f"{name}[{j}]"
        if not isinstance(part, dict):
            raise RecordError(where, 'must be a content part: {"type": "text", "text": ...}')
        if part.get("type") != "text":
            kind = part.get("type")
            raise RecordError(
                f"{where}.type",
                f"{kind!r} content parts are not supported: only text parts ('type': 'text')",
            )
        if not isinstance(part.get("text"), str):
            raise RecordError(f"{where}.text", "must be a string")
        texts.append(part["text"])
    return text("\n".join(texts), name)


def a_role(value: Any, name: str) -> str:
    if value not in ROLES:
        raise RecordError(name, f"must be one of {', '.join(ROLES)}")
    return value


def message(msg: Any, where: str) -> dict[str, str]:
    if not isinstance(msg, dict):
        raise RecordError(where, "must be an object with 'role' and 'content'")
    role, content = each(
        lambda: a_role(msg.get("role"), f"{where}.role"),
        lambda: message_content(msg.get("content"), f"{where}.content"),
    )
    return {"role": role, "content": content}


def messages(value: Any, name: str) -> list[dict[str, str]]:
    """Every message is checked: each bad role or content is its own error."""
    if not isinstance(value, list) or not value:
        raise RecordError(name, "must be a non-empty list of messages")
    checks = [lambda m=msg, i=i: message(m, f"{name}[{i}]") for i, msg in enumerate(value)]
    return each(*checks)


def text_or_messages(value: Any, name: str) -> str | list[dict[str, str]]:
    return messages(value, name) if isinstance(value, list) else text(value, name)


def no_lone_surrogates(raw: str, obj: Any) -> None:
    """Refuse a record holding a lone UTF-16 surrogate (`"\\ud800x"`) anywhere, a key or a
    value, naming its field: it would pass here and fail every job at tokenization."""
    if _SURROGATE_ESCAPE.search(raw) is None:
        return
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            _encodable(value, where or "(json)")
        elif isinstance(value, dict):
            for key, item in value.items():
                _encodable(key, f"{where}.{key!r}" if where else repr(key))
                stack.append((f"{where}.{key}" if where else key, item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))


def _encodable(value: str, where: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RecordError(
            where,
            f"holds a lone UTF-16 surrogate (\\u{ord(value[exc.start]):04x}) at character "
            f"{exc.start}: not valid Unicode; escape a character outside the BMP as a pair",
        ) from None
