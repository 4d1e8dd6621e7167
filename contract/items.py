"""Which lines of a prompt file hold which fields (the items OpenAI's graders read as
``{{item.<field>}}``), profiled while the file is validated at upload and stored with its row,
so a job whose grader reads a field that some line lacks is refused at creation without
reading the file again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_PROFILED_FIELDS = 64  # fields of a prompt file's first line whose presence is tracked


@dataclass
class FieldProfile:
    """Which lines of a prompt file hold which fields, kept while the file is validated so a
    job can be refused when its grader reads a field some line lacks, without reading the
    file again. Only the first record's fields can be on every line, so only they are
    tracked: `missing[f]` is the first line without field f (None: every line has it); a
    field the first record lacks is missing from `first_line`. A null value counts as absent.
    `complete` is False when the first record had more fields than are tracked (then an
    untracked field is not known to be missing). Stored as JSON with the file's row
    (`as_json` / `from_json`)."""

    first_line: int
    missing: dict[str, int | None]
    complete: bool = True

    @classmethod
    def start(cls, record: dict, line: int) -> FieldProfile:
        keys = [k for k in record if k != "prompt" and record[k] is not None]
        tracked = keys[:MAX_PROFILED_FIELDS]
        return cls(line, dict.fromkeys(tracked), complete=len(tracked) == len(keys))

    def note(self, record: dict, line: int) -> None:
        for key, missing in self.missing.items():
            if missing is None and record.get(key) is None:
                self.missing[key] = line

    def first_line_without(self, name: str) -> int | None:
        """The first line that lacks field `name`, or None when every line has it (or, past
        the tracked fields, when that is not known). Every record has a prompt."""
        if name in self.missing:
            return self.missing[name]
        return None if name == "prompt" or not self.complete else self.first_line

    def as_json(self) -> dict[str, Any]:
        return {"first_line": self.first_line, "missing": self.missing, "complete": self.complete}

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
        )
