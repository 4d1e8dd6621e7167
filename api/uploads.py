"""Validate an upload while streaming through it, before anything reaches the object store.

Starlette has already spooled the multipart file to a local temporary file (memory up to
1 MiB, then disk). Pass 1 (here) reads it in chunks, line by line through the data module's
validator, counting and hashing; only a fully valid file gets pass 2, where the route streams
the same spool file into the store under its final key (put_stream is atomic: temp object,
then rename). A refused upload therefore never creates an object or a row, and memory stays
bounded by one chunk plus one line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class ValidUpload:
    bytes: int
    sha256: str
    format: str
    records: int


class _LimitedValidator(JsonlValidator):
    """JsonlValidator with the service's (possibly tighter) line limit; tolerates a BOM."""

    def __init__(self, allowed, max_line_bytes: int):
        super().__init__(allowed)
        self.max_line_bytes = max_line_bytes

    def feed(self, raw: bytes) -> dict | None:
        if self._line == 0 and raw.startswith(_BOM):
            raw = raw[len(_BOM) :]
        if len(raw) > self.max_line_bytes:
            self._line += 1
            self.report.add(
                LineError(self._line, "(line)", f"longer than {self.max_line_bytes} bytes")
            )
            return None
        return super().feed(raw)


def read_chunks(stream: BinaryIO, chunk_size: int = CHUNK) -> Iterator[bytes]:
    while chunk := stream.read(chunk_size):
        yield chunk


def validate_upload(
    stream: BinaryIO, *, purpose: str, max_bytes: int, max_line_bytes: int
) -> ValidUpload:
    """Read `stream` to its end (or to the first reason to refuse it) and validate every line.

    Raises UploadRejected(413) past `max_bytes`, UploadRejected(422) with line-numbered
    errors (at most MAX_ERRORS; reading stops there) for invalid or empty content."""
    validator = _LimitedValidator(ALLOWED_FORMATS[purpose], max_line_bytes)
    digest = hashlib.sha256()
    size = 0

    def counted() -> Iterator[bytes]:
        nonlocal size
        for chunk in read_chunks(stream):
            size += len(chunk)
            if size > max_bytes:
                raise UploadRejected(413, f"file larger than {max_bytes} bytes")
            digest.update(chunk)
            yield chunk

    for line in iter_lines(counted()):
        validator.feed(line)
        if validator.report.error_count >= MAX_ERRORS:
            break  # enough to fix; do not parse a gigabyte of garbage
    report = validator.finish()
    if not report.ok:
        errors = [{"line": e.line, "field": e.field, "message": e.message} for e in report.errors]
        first = report.errors[0]
        more = "" if report.error_count == 1 else f" (and {report.error_count - 1} more)"
        raise UploadRejected(
            422,
            f"invalid {purpose} file: line {first.line}: {first.field}: {first.message}{more}",
            errors,
        )
    assert report.format is not None
    return ValidUpload(size, digest.hexdigest(), report.format, report.records)
