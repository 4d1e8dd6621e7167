"""Follow a JSONL file another process appends to (the trainer's metrics and events)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("humanline.worker")


class JsonlTail:
    """Returns the complete lines appended since the last call, parsed.

    A line without its newline yet is left for the next call (the writer is mid-line); a
    line that does not parse is logged and skipped rather than stopping the job's records.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        return [record for record, _ in self.read_with_offsets()]

    def read_with_offsets(self) -> list[tuple[dict[str, Any], int]]:
        """The new records, each with the offset where its line starts: set `offset` back to
        it to read that record (and what follows) again next time."""
        try:
            with open(self.path, "rb") as fh:
                if fh.seek(0, 2) < self.offset:  # rewritten shorter: start over
                    self.offset = 0
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        start = self.offset
        self.offset += end + 1
        records = []
        for raw in chunk[: end + 1].splitlines(keepends=True):
            line_start, start = start, start + len(raw)
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except ValueError:
                log.warning("skipping an unreadable line of %s: %r", self.path, raw[:200])
                continue
            if isinstance(record, dict):
                records.append((record, line_start))
        return records
