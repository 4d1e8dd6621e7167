"""Dataset formats of DESIGN.md §3: detection, line-numbered validation, normalisation.

Pure Python, no torch: the API validates uploads with it while streaming, the trainer
loads training files with it. A file is one format; the first valid line decides which.
Records are normalised so the rest of the code sees one shape per format:

- preference: {"prompt", "chosen", "rejected"}; each a string, or (conversational) a list of
  {"role", "content"} messages with the prompt ending before the assistant's turn;
- unpaired: {"prompt", "completion", "label": bool};
- sft: {"prompt", "completion"} (strings or message lists), or OpenAI's chat format
  {"messages": [...]} ending with an assistant turn; an assistant message may carry
  `weight` 0 or 1 (0: not learned). Tool and function calling are refused (contract.sft_data);
- prompt: {"prompt", "answer"?, ...extra columns kept for reward functions}; OpenAI's
  reinforcement lines, {"messages": [...], ...the item's fields} not ending with an assistant
  turn, normalise to it (the messages become the prompt, every other field is kept for the
  graders);
- eval_instruction: {"instruction", "output", "generator"?};
- eval_math: {"problem", "answer", "level"?, "subject"?}.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Literal

from contract.items import reinforcement_prompt
from contract.records import ROLES as ROLES
from contract.records import VISIBLE as _VISIBLE
from contract.records import RecordError as RecordError
from contract.records import RecordErrors as RecordErrors
from contract.records import each as _each
from contract.records import messages as _messages
from contract.records import no_lone_surrogates
from contract.records import text as _text
from contract.records import text_or_messages as _text_or_messages
from contract.sft_data import is_sft, parse_sft

Format = Literal["preference", "unpaired", "sft", "prompt", "eval_instruction", "eval_math"]
TRAIN_FORMATS: tuple[Format, ...] = ("preference", "unpaired", "sft", "prompt")
EVAL_FORMATS: tuple[Format, ...] = ("eval_instruction", "eval_math")
MAX_LINE_BYTES = 1 << 20  # 1 MiB per JSONL line
MAX_ERRORS = 20
MAX_ERRORS_PER_LINE = 8  # every error of a line is reported, up to this many
MAX_WARNINGS = 20
# Columns each format reads; others are listed as warnings (the prompt format keeps every
# column: extra ones reach reward functions).
KNOWN_KEYS: dict[str, frozenset[str] | None] = {
    "preference": frozenset(
        {"prompt", "chosen", "rejected", "input", "preferred_output", "non_preferred_output"}
    ),
    "unpaired": frozenset({"prompt", "completion", "label"}),
    "sft": frozenset({"prompt", "completion", "messages"}),
    "prompt": None,
    "eval_instruction": frozenset({"instruction", "output", "generator"}),
    "eval_math": frozenset({"problem", "answer", "level", "subject"}),
}


@dataclass(frozen=True)
class LineError:
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.field}: {self.message}"


@dataclass
class ValidationReport:
    format: Format | None = None
    records: int = 0
    errors: list[LineError] = field(default_factory=list)
    error_count: int = 0
    unknown_keys: dict[str, int] = field(default_factory=dict)  # column -> first line

    @property
    def warnings(self) -> list[str]:
        return [
            f"line {line}: unknown column {key!r} is ignored"
            for key, line in list(self.unknown_keys.items())[:MAX_WARNINGS]
        ]

    @property
    def ok(self) -> bool:
        return self.error_count == 0 and self.records > 0

    def add(self, err: LineError) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(err)


def _differ(chosen: Any, rejected: Any, name: str = "rejected") -> None:
    if chosen == rejected:
        raise RecordError(name, "is identical to the preferred answer: a pair must differ")


def _completion_pair(obj: dict, keys: tuple[str, str]) -> tuple[Any, Any]:
    a, b = _each(
        lambda: _text_or_messages(obj.get(keys[0]), keys[0]),
        lambda: _text_or_messages(obj.get(keys[1]), keys[1]),
    )
    if type(a) is not type(b):
        raise RecordError(keys[1], f"must have the same type as '{keys[0]}'")
    _differ(a, b, keys[1])
    return a, b


def _preference(obj: dict) -> dict:
    prompt, chosen, rejected = obj.get("prompt"), obj.get("chosen"), obj.get("rejected")
    if (  # the common case, three non-blank strings: what the checks below would return
        type(prompt) is str
        and type(chosen) is str
        and type(rejected) is str
        and "input" not in obj
        and prompt
        and chosen
        and rejected
        and chosen != rejected
        and _VISIBLE.search(prompt)
        and _VISIBLE.search(chosen)
        and _VISIBLE.search(rejected)
    ):
        return {"prompt": prompt, "chosen": chosen, "rejected": rejected}
    if "input" in obj:  # OpenAI DPO layout
        inp = obj["input"]
        if not isinstance(inp, dict):
            raise RecordError("input", "must be an object with 'messages'")
        prompt, (chosen, rejected) = _each(
            lambda: _messages(inp.get("messages"), "input.messages"),
            lambda: _completion_pair(obj, ("preferred_output", "non_preferred_output")),
        )
        return {"prompt": prompt, "chosen": chosen, "rejected": rejected}
    prompt, pair = _each(
        lambda: _text_or_messages(obj.get("prompt"), "prompt"),
        lambda: _completion_pair(obj, ("chosen", "rejected")),
    )
    chosen, rejected = pair
    if isinstance(prompt, str) and isinstance(chosen, list):
        raise RecordError("prompt", "must be a message list when 'chosen' is one")
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def _unpaired(obj: dict) -> dict:
    def label() -> bool:
        if not isinstance(obj.get("label"), bool):
            raise RecordError("label", "must be true or false")
        return obj["label"]

    prompt, completion, label_ = _each(
        lambda: _text_or_messages(obj.get("prompt"), "prompt"),
        lambda: _text_or_messages(obj.get("completion"), "completion"),
        label,
    )
    return {"prompt": prompt, "completion": completion, "label": label_}


def _prompt(obj: dict) -> dict:
    if "prompt" not in obj and "messages" in obj:  # OpenAI's reinforcement layout
        out = reinforcement_prompt(obj)
    else:
        out = dict(obj)
        out["prompt"] = _text_or_messages(obj.get("prompt"), "prompt")
    if "answer" in obj and not isinstance(obj["answer"], (str, int, float)):
        raise RecordError("answer", "must be a string or a number")
    if "answer" in obj:
        out["answer"] = str(obj["answer"])
    return out


def _eval_instruction(obj: dict) -> dict:
    instruction, output = _each(
        lambda: _text(obj.get("instruction"), "instruction"),
        lambda: _text(obj.get("output"), "output"),
    )
    out = {"instruction": instruction, "output": output}
    if obj.get("generator") is not None:
        out["generator"] = _text(obj["generator"], "generator")
    return out


def _eval_math(obj: dict) -> dict:
    out = {"problem": _text(obj.get("problem"), "problem")}
    answer = obj.get("answer")
    out["answer"] = _text(str(answer) if isinstance(answer, (int, float)) else answer, "answer")
    for key in ("level", "subject"):
        if obj.get(key) is not None:
            out[key] = str(obj[key])
    return out


_PARSERS = {
    "preference": _preference,
    "unpaired": _unpaired,
    "sft": parse_sft,
    "prompt": _prompt,
    "eval_instruction": _eval_instruction,
    "eval_math": _eval_math,
}


def detect_format(obj: dict) -> Format:
    """Decide the format from the columns present."""
    if ("chosen" in obj and "rejected" in obj) or (
        "preferred_output" in obj and "non_preferred_output" in obj
    ):
        return "preference"
    if "completion" in obj and "label" in obj:
        return "unpaired"
    if is_sft(obj):
        return "sft"
    if "instruction" in obj and "output" in obj:
        return "eval_instruction"
    if "problem" in obj and "answer" in obj:
        return "eval_math"
    if "prompt" in obj:
        return "prompt"
    if "messages" in obj:  # OpenAI's reinforcement layout: messages + the item's fields
        return "prompt"
    raise RecordError(
        "(columns)",
        "unknown format: expected prompt/chosen/rejected, input/preferred_output/"
        "non_preferred_output, prompt/completion/label, prompt/completion, messages (ending "
        "with an assistant turn: sft; else a prompt and the item's fields), prompt[/answer], "
        "instruction/output or problem/answer; got " + ", ".join(map(repr, sorted(obj)[:8])),
    )


_scan_object = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # json.loads' own scanner (C)


def _loads(text: str) -> Any:
    """json.loads(text), minus its wrapper's cost for the usual JSONL line: one object from
    the first character to the last. Anything else (leading or trailing whitespace, a BOM,
    an error) goes through json.loads itself, so results and errors are exactly its own."""
    if text[:1] == "{":
        try:
            obj, end = _scan_object(text, 0)
        except Exception:  # noqa: BLE001 - json.loads below raises the real error
            end = -1
        if end == len(text):
            return obj
    return json.loads(text)


def _mixed(obj: dict, line_fmt: Format, fmt: Format) -> RecordError:
    """A line of another format than the file's first: where OpenAI's `messages` decide it
    (a last assistant turn: supervised; else a reinforcement prompt), the turn to change."""
    turns = obj.get("messages")
    if {line_fmt, fmt} == {"sft", "prompt"} and isinstance(turns, list) and turns:
        where = f"messages[{len(turns) - 1}].role"
        if line_fmt == "sft":
            return RecordError(
                where,
                "the last turn is an assistant turn: that is supervised data, and this file "
                "holds reinforcement prompts (their messages end with a user turn; the "
                "expected answer goes in a field such as 'answer')",
            )
        return RecordError(
            where,
            "the last turn is not an assistant turn: this file is supervised data, whose "
            "conversations end with the assistant's answer",
        )
    return RecordError("(columns)", f"mixed formats: this line is {line_fmt}, file is {fmt}")


def parse_line(raw: bytes | str, fmt: Format | None) -> tuple[Format, dict]:
    """Parse one JSONL line; raises RecordError naming the field, or RecordErrors naming
    every bad field of the record."""
    line_fmt, record, _ = parse_record(raw, fmt)
    return line_fmt, record


def parse_record(raw: bytes | str, fmt: Format | None) -> tuple[Format, dict, set[str]]:
    """parse_line, plus the line's columns that its format does not read."""
    if isinstance(raw, bytes):
        if len(raw) > MAX_LINE_BYTES:
            raise RecordError("(line)", f"longer than {MAX_LINE_BYTES} bytes")
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError("(line)", f"not valid UTF-8 at byte {exc.start}") from None
    try:
        obj = _loads(raw)
    except json.JSONDecodeError as exc:
        raise RecordError("(json)", f"malformed JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:  # "[[[[..." a few thousand deep: a 500 otherwise
        raise RecordError("(json)", "nested too deeply") from None
    if not isinstance(obj, dict):
        raise RecordError("(json)", "each line must be a JSON object")
    no_lone_surrogates(raw, obj)
    line_fmt = detect_format(obj)
    if fmt is not None and line_fmt != fmt:
        raise _mixed(obj, line_fmt, fmt)
    known = KNOWN_KEYS[line_fmt]
    return line_fmt, _PARSERS[line_fmt](obj), (obj.keys() - known) if known is not None else set()


UTF8_BOM = b"\xef\xbb\xbf"


class JsonlValidator:
    """Incremental validator: feed lines as they stream in, read the report at the end.

    The one validator of training and eval files: the API validates uploads with it and the
    trainer reads files with it (read_jsonl), so a file the API accepts, the trainer reads.
    A UTF-8 byte-order mark before the first line is skipped (editors on Windows write one);
    `max_line_bytes` may tighten the format's own line limit (MAX_LINE_BYTES)."""

    def __init__(
        self,
        allowed: Iterable[Format] = TRAIN_FORMATS + EVAL_FORMATS,
        max_line_bytes: int = MAX_LINE_BYTES,
    ):
        self.allowed = tuple(allowed)
        self.max_line_bytes = max_line_bytes
        self.report = ValidationReport()
        self._line = 0

    def feed(self, raw: bytes) -> dict | None:
        if self._line == 0 and raw.startswith(UTF8_BOM):
            raw = raw[len(UTF8_BOM) :]
        self._line += 1
        if len(raw) > self.max_line_bytes:
            too_long = f"longer than {self.max_line_bytes} bytes"
            self.report.add(LineError(self._line, "(line)", too_long))
            return None
        if not raw or raw.isspace():  # = `not raw.strip()`, without copying the line
            return None  # blank lines are allowed (trailing newline, separators)
        try:
            fmt, record, unknown = parse_record(raw, self.report.format)
            if fmt not in self.allowed:
                raise RecordError("(columns)", f"format {fmt} is not allowed here")
        except RecordErrors as errs:
            for err in errs.errors[:MAX_ERRORS_PER_LINE]:
                self.report.add(LineError(self._line, err.field, err.message))
            return None
        except RecordError as err:
            self.report.add(LineError(self._line, err.field, err.message))
            return None
        self.report.format = fmt
        self.report.records += 1
        for key in unknown:
            self.report.unknown_keys.setdefault(key, self._line)
        return record

    def finish(self) -> ValidationReport:
        if self.report.records == 0 and self.report.error_count == 0:
            self.report.add(LineError(max(self._line, 1), "(file)", "no records"))
        return self.report


class JsonlReader:
    """A JSONL file read one validated record at a time (the trainer's way to read a
    training file of any size: one line in memory, never the whole file).

    Iterating yields every valid record; `offset` is then the byte offset of the record's
    line (`record_at` reads it again). After the last record it raises ValueError listing the
    bad lines, as read_jsonl does, so a file with any invalid line never trains. `format`
    (decided by the first valid record) is known once the first record was yielded; `first()`
    reads ahead to it."""

    def __init__(self, path: str, allowed: Iterable[Format] = TRAIN_FORMATS):
        self.path = path
        self.validator = JsonlValidator(allowed)
        self.offset = -1
        self._records = self._read()
        self._ahead: list[dict] = []

    @property
    def format(self) -> Format | None:
        return self.validator.report.format

    @property
    def records(self) -> int:
        """Valid records read so far (all of them once iteration ended)."""
        return self.validator.report.records

    def first(self) -> Format:
        """Read up to the first valid record (ValueError when there is none) and return the
        file's format; iteration still starts with that record."""
        if not self._ahead and self.format is None:
            self._ahead.append(next(self._records))  # raises ValueError when none is valid
        assert self.format is not None
        return self.format

    def __iter__(self) -> Iterator[dict]:
        while self._ahead:
            yield self._ahead.pop(0)
        yield from self._records

    def _read(self) -> Iterator[dict]:
        validator = self.validator
        position = 0
        with open(self.path, "rb") as fh:
            for raw in fh:
                record = validator.feed(raw.rstrip(b"\r\n"))
                if record is not None:
                    self.offset = position
                    yield record
                position += len(raw)
        report = validator.finish()
        if not report.ok:
            shown = "; ".join(str(e) for e in report.errors[:5])
            raise ValueError(f"{self.path}: {report.error_count} invalid line(s): {shown}")


def record_at(fh: BinaryIO, offset: int, fmt: Format) -> dict:
    """The record of the line at byte `offset` of an open JSONL file (an offset JsonlReader
    gave for a valid line): parsed exactly as it was then."""
    fh.seek(offset)
    raw = fh.readline().rstrip(b"\r\n")
    if offset == 0 and raw.startswith(UTF8_BOM):
        raw = raw[len(UTF8_BOM) :]
    return parse_line(raw, fmt)[1]


def read_jsonl(path: str, allowed: Iterable[Format] = TRAIN_FORMATS) -> tuple[Format, list[dict]]:
    """Load a whole (already trusted or small) file; raise ValueError listing bad lines.
    Training files are read with JsonlReader instead, a record at a time."""
    reader = JsonlReader(path, allowed)
    records = list(reader)
    assert reader.format is not None
    return reader.format, records


def iter_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Split a byte stream into lines holding at most one (bounded) line in memory.

    A line longer than MAX_LINE_BYTES is yielded once, cut short (parse_line then reports
    it as too long), and the rest of it is skipped so line numbers stay right.
    """
    buf = b""
    skipping = False
    for chunk in chunks:
        buf = buf + chunk if buf else bytes(chunk)  # no copy of a chunk when nothing is left
        lines = buf.split(b"\n")
        buf = lines.pop()
        if lines:
            if skipping:  # the first piece ends the over-long line: skipped
                skipping = False
                del lines[0]
            yield from lines
        if len(buf) > MAX_LINE_BYTES and not skipping:
            yield buf
            skipping = True
        if skipping:
            buf = b""
    if buf and not skipping:
        yield buf
