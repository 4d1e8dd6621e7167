"""Validate an upload while streaming it to a local spool file, in one pass.

Nothing reaches the object store until the whole file is known to be good: the route then
stores the spool file under its final key (put_file is atomic), so a rejected upload leaves
no object and no row. Memory stays bounded by one chunk plus one line.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from trainer.spec.data import (
    EVAL_FORMATS,
    MAX_ERRORS,
    TRAIN_FORMATS,
    JsonlValidator,
    LineError,
    iter_lines,
)

CHUNK = 1 << 20
_BOM = b"\xef\xbb\xbf"
ALLOWED_FORMATS = {"train": TRAIN_FORMATS, "eval": EVAL_FORMATS}


@dataclass
class UploadRejected(Exception):
    """Why an upload was refused: status 413 (too large) or 422 (invalid content)."""

    status: int
    message: str
    errors: list[dict] = field(default_factory=list)


@dataclass
class SpooledUpload:
    path: Path
    bytes: int
    sha256: str
    format: str
    records: int

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


class _LimitedValidator(JsonlValidator):
    """JsonlValidator with the service's (possibly tighter) line-length limit."""

    def __init__(self, allowed, max_line_bytes: int):
        super().__init__(allowed)
        self.max_line_bytes = max_line_bytes

    def feed(self, raw: bytes) -> dict | None:
        if self._line == 0 and raw.startswith(_BOM):
            raw = raw[len(_BOM):]
        if len(raw) > self.max_line_bytes:
            self._line += 1
            self.report.add(LineError(self._line, "(line)",
                                      f"longer than {self.max_line_bytes} bytes"))
            return None
        return super().feed(raw)


def spool_and_validate(
    stream: BinaryIO,
    *,
    purpose: str,
    max_bytes: int,
    max_line_bytes: int,
    spool_dir: str | None = None,
) -> SpooledUpload:
    """Read `stream` to the end (or to the first reason to refuse it), validating every line.

    Raises UploadRejected; on success the caller owns the returned spool file."""
    validator = _LimitedValidator(ALLOWED_FORMATS[purpose], max_line_bytes)
    digest = hashlib.sha256()
    size = 0
    fd, name = tempfile.mkstemp(prefix="upload-", suffix=".jsonl", dir=spool_dir)
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:

            def chunks() -> Iterator[bytes]:
                nonlocal size
                while chunk := stream.read(CHUNK):
                    size += len(chunk)
                    if size > max_bytes:
                        raise UploadRejected(413, f"file larger than {max_bytes} bytes")
                    digest.update(chunk)
                    out.write(chunk)
                    yield chunk

            for line in iter_lines(chunks()):
                validator.feed(line)
                if validator.report.error_count >= MAX_ERRORS:
                    break  # enough to fix; do not parse a gigabyte of garbage
        report = validator.finish()
        if not report.ok:
            errors = [{"line": e.line, "field": e.field, "message": e.message}
                      for e in report.errors]
            first = report.errors[0]
            more = "" if report.error_count == 1 else f" (and {report.error_count - 1} more)"
            raise UploadRejected(
                422, f"invalid {purpose} file: line {first.line}: {first.field}: "
                     f"{first.message}{more}", errors,
            )
        assert report.format is not None
        return SpooledUpload(path, size, digest.hexdigest(), report.format, report.records)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
