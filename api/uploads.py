"""Receive an upload in one pass: parse the multipart body as it arrives, validate the file
line by line, hash it and write it to the object store, all at once.

The route (api.routes.files) pumps the request body from the event loop into a worker thread
(api.bodypump.BodyPump, a small read-ahead queue of ~1 MiB blocks), where `receive_upload`
parses the multipart framing (python-multipart's streaming parser), and sends the bytes of the
part named `file` through `UploadChecker.check` straight into `store.put_stream(key, ...)`.
The checker validates every line a chunk completes and raises `UploadRejected` at the first
reason to refuse the file, or after its last chunk unless it is entirely valid. `put_stream`
writes to a temporary object and publishes it under `key` only when its chunk iterator ends
normally, so a refused upload never creates an object (nor, later, a row). Memory stays bounded by
the read-ahead blocks, one chunk and one line; nothing is spooled to local disk, and the
socket, the JSON parsing and the store write overlap.

A client that sends the file before the `purpose` field (curl -F file=@x -F purpose=train
does) cannot be validated on the fly: which formats are allowed depends on the purpose. That
file is spooled to a local temporary file, then validated and stored in two passes.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO, cast

from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

from contract.data import (
    EVAL_FORMATS,
    MAX_ERRORS,
    TRAIN_FORMATS,
    JsonlValidator,
    iter_lines,
)
from contract.items import FieldProfile
from storage import ObjectStore

CHUNK = 1 << 20
ALLOWED_FORMATS = {"train": TRAIN_FORMATS, "eval": EVAL_FORMATS, "fine-tune": TRAIN_FORMATS}
PURPOSES = tuple(ALLOWED_FORMATS)
MAX_FIELD_BYTES = 1 << 20  # a form field other than the file (as Starlette's default)
MAX_PARTS = 1000
MAX_BOUNDARY = 70  # RFC 2046 §5.1.1: a boundary is 1 to 70 characters
SPOOL_IN_MEMORY = 1 << 20  # the file-before-purpose case: memory up to 1 MiB, then disk


@dataclass
class UploadRejected(Exception):
    """Why an upload was refused: status 400 (malformed body), 413 (too large) or 422
    (invalid content)."""

    status: int
    message: str
    errors: list[dict] = field(default_factory=list)
    field: str | None = None


class FormInvalid(Exception):
    """Missing or invalid form fields, as FastAPI's request validation reports them."""

    def __init__(self, errors: list[dict[str, Any]]):
        super().__init__(errors)
        self.errors = errors


@dataclass(frozen=True)
class ValidUpload:
    bytes: int
    sha256: str
    format: str
    records: int
    warnings: tuple[str, ...] = ()  # columns the format does not read (contract.data)
    fields: dict[str, Any] | None = None  # prompt files: contract.items.FieldProfile as JSON


@dataclass(frozen=True)
class ReceivedUpload:
    """A validated upload, already stored under its key."""

    valid: ValidUpload
    purpose: str
    filename: str | None


def read_chunks(stream: BinaryIO, chunk_size: int = CHUNK) -> Iterator[bytes]:
    while chunk := stream.read(chunk_size):
        yield chunk


class _Sha256InBackground:
    """sha256 of chunks fed in order, computed by a helper thread: hashlib releases the GIL
    on large buffers, so hashing (~500 MB/s) overlaps the JSON parsing of the same bytes
    instead of adding to it."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="upload-sha256")

    def update(self, chunk: bytes) -> None:
        self._pool.submit(self._digest.update, chunk)  # one worker: FIFO, in order

    def hexdigest(self) -> str:
        self._pool.shutdown(wait=True)
        return self._digest.hexdigest()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class UploadChecker:
    """Counts, hashes and validates an upload's bytes on their way to the store."""

    def __init__(self, *, purpose: str, max_bytes: int, max_line_bytes: int):
        self.purpose = purpose
        self.max_bytes = max_bytes
        self.validator = JsonlValidator(ALLOWED_FORMATS[purpose], max_line_bytes)
        self.digest = _Sha256InBackground()
        self.size = 0
        self.fields: FieldProfile | None = None  # prompt files: which lines hold which fields
        self._result: ValidUpload | None = None
        self._finished = False

    def check(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """Yield `chunks` unchanged, validating every line as it completes.

        Raises UploadRejected(413) past `max_bytes`, UploadRejected(422) with line-numbered
        errors (at most MAX_ERRORS; reading stops there) for invalid or empty content, the
        latter at the latest before returning after the last chunk: a consumer that writes
        what it is given and publishes only at the end never publishes an invalid file."""
        ready: list[bytes] = []  # chunks read by the line splitter, not yet passed on

        def counted() -> Iterator[bytes]:
            for chunk in chunks:
                self.size += len(chunk)
                if self.size > self.max_bytes:
                    raise UploadRejected(413, f"file larger than {self.max_bytes} bytes")
                self.digest.update(chunk)
                ready.append(chunk)
                yield chunk

        validator = self.validator
        number = 0
        try:
            for line in iter_lines(counted()):
                number += 1
                record = validator.feed(line)
                if record is not None and validator.report.format == "prompt":
                    self._profile(record, number)
                if validator.report.error_count >= MAX_ERRORS:
                    break  # enough to fix; do not parse a gigabyte of garbage
                if ready:
                    yield from ready
                    ready.clear()
            self.result()  # raises for an invalid file, before its last bytes are passed on
        finally:
            self.digest.close()
        yield from ready

    def _profile(self, record: dict, line: int) -> None:
        if self.fields is None:
            self.fields = FieldProfile.start(record, line)
        else:
            self.fields.note(record, line)

    def result(self) -> ValidUpload:
        """The verdict once every chunk was checked: the upload, or UploadRejected(422)."""
        if self._result is not None:
            return self._result
        report = self.validator.report if self._finished else self.validator.finish()
        self._finished = True
        if not report.ok:
            errors = [
                {"line": e.line, "field": e.field, "message": e.message} for e in report.errors
            ]
            first = report.errors[0]
            more = "" if report.error_count == 1 else f" (and {report.error_count - 1} more)"
            raise UploadRejected(
                422,
                f"invalid {self.purpose} file: line {first.line}: {first.field}: "
                f"{first.message}{more}",
                errors,
            )
        assert report.format is not None
        self._result = ValidUpload(
            self.size, self.digest.hexdigest(), report.format, report.records,
            tuple(report.warnings),
            self.fields.as_json() if self.fields is not None else None,
        )
        return self._result


def validate_upload(
    stream: BinaryIO, *, purpose: str, max_bytes: int, max_line_bytes: int
) -> ValidUpload:
    """Read `stream` to its end (or to the first reason to refuse it) and validate every line.

    Raises UploadRejected(413) past `max_bytes`, UploadRejected(422) with line-numbered
    errors (at most MAX_ERRORS; reading stops there) for invalid or empty content."""
    checker = UploadChecker(purpose=purpose, max_bytes=max_bytes, max_line_bytes=max_line_bytes)
    for _ in checker.check(read_chunks(stream)):
        pass
    return checker.result()


# --- the multipart body -----------------------------------------------------------------------


def form_errors(*, has_file: bool, purpose: str | None) -> list[dict[str, Any]]:
    """The errors FastAPI's validation gives for `file: UploadFile, purpose: Literal[...]`."""
    errors: list[dict[str, Any]] = []
    if not has_file:
        errors.append({"type": "missing", "loc": ("body", "file"), "msg": "Field required"})
    if purpose is None:
        errors.append({"type": "missing", "loc": ("body", "purpose"), "msg": "Field required"})
    elif purpose not in PURPOSES:
        errors.append(
            {
                "type": "literal_error",
                "loc": ("body", "purpose"),
                "msg": "Input should be " + " or ".join(repr(p) for p in PURPOSES),
            }
        )
    return errors


def multipart_boundary(content_type: str) -> bytes | None:
    """The boundary of a multipart/form-data content type, or None for any other type."""
    kind, options = parse_options_header(content_type)
    if kind != b"multipart/form-data":
        return None
    boundary = options.get(b"boundary")
    if not boundary:
        raise UploadRejected(400, "malformed multipart body: no boundary in Content-Type")
    if len(boundary) > MAX_BOUNDARY:  # (past 256, python-multipart raises in its constructor)
        raise UploadRejected(
            400, f"malformed multipart body: a boundary is at most {MAX_BOUNDARY} characters"
        )
    return boundary


_FIELD, _FILE, _DATA, _FILE_END = "field", "file", "data", "file_end"


class _MultipartEvents:
    """python-multipart's callbacks turned into a stream of events:
    (_FIELD, name, value) for a complete small field, (_FILE, filename) when the part named
    `file` starts, (_DATA, bytes) for its content, (_FILE_END,) when it ends. Other parts
    with a filename are skipped."""

    def __init__(self, body: Iterable[bytes], boundary: bytes):
        self.body = body
        self.pending: list[tuple] = []
        self.parts = 0
        self._header_name = b""
        self._header_value = b""
        self._disposition = b""
        self._mode = ""  # "field", "file" (the upload), "skip" (another file)
        self._name = ""
        self._value = bytearray()
        callbacks = {
            "on_part_begin": self._part_begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value_cb,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }
        self.parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple]:
        try:
            for block in self.body:
                self.parser.write(block)
                if self.pending:
                    yield from self.pending
                    self.pending.clear()
        except UploadRejected:
            raise
        except Exception as exc:  # the parser's errors: FormParserError, MultipartParseError
            if type(exc).__module__.startswith("python_multipart"):
                raise UploadRejected(400, f"malformed multipart body: {exc}") from None
            raise
        if self.parser.state != MultipartState.END:
            raise UploadRejected(400, "malformed multipart body: it ends before its last part")

    def _part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise UploadRejected(400, f"malformed multipart body: more than {MAX_PARTS} parts")
        self._disposition = b""

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _header_value_cb(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            self._disposition = self._header_value
        self._header_name = self._header_value = b""

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        if b"name" not in options:
            raise UploadRejected(400, "malformed multipart body: a part has no name")
        self._name = options[b"name"].decode("utf-8", "replace")
        if b"filename" in options:
            if self._name == "file":
                self._mode = "file"
                self.pending.append((_FILE, options[b"filename"].decode("utf-8", "replace")))
            else:
                self._mode = "skip"
        elif self._name == "file":
            raise FormInvalid(
                [
                    {
                        "type": "value_error",
                        "loc": ("body", "file"),
                        "msg": "Value error, Expected UploadFile, received: <class 'str'>",
                    }
                ]
            )
        else:
            self._mode = "field"
            self._value = bytearray()

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._mode == "file":
            self.pending.append((_DATA, data[start:end]))
        elif self._mode == "field":
            if len(self._value) + end - start > MAX_FIELD_BYTES:
                raise UploadRejected(
                    400, f"form field {self._name!r} is over {MAX_FIELD_BYTES} bytes"
                )
            self._value += data[start:end]

    def _part_end(self) -> None:
        if self._mode == "file":
            self.pending.append((_FILE_END,))
        elif self._mode == "field":
            self.pending.append((_FIELD, self._name, self._value.decode("utf-8", "replace")))
        self._mode = ""


def receive_upload(
    body: Iterable[bytes],
    boundary: bytes,
    *,
    store: ObjectStore,
    key: str,
    max_bytes: int,
    max_line_bytes: int,
) -> ReceivedUpload:
    """Parse a multipart body from `body`, validate its `file` part for its `purpose`, and
    store it under `key`. Blocking: run it in a worker thread.

    Raises FormInvalid (422: `file` or `purpose` missing or invalid), UploadRejected (400,
    413, 422) or the store's errors; in every such case nothing is left under `key`."""
    events = iter(_MultipartEvents(body, boundary))
    purpose: str | None = None
    filename: str | None = None
    for event in events:
        if event[0] == _FIELD:
            if event[1] == "purpose":
                purpose = event[2]
        elif event[0] == _FILE:
            filename = event[1]
            break
    else:
        raise FormInvalid(form_errors(has_file=False, purpose=purpose))

    if purpose is None:  # the file came first: keep it aside until the purpose arrives
        return _receive_spooled(events, filename, store=store, key=key, max_bytes=max_bytes,
                                max_line_bytes=max_line_bytes)  # fmt: skip
    if purpose not in PURPOSES:
        raise FormInvalid(form_errors(has_file=True, purpose=purpose))

    def file_then_rest() -> Iterator[bytes]:
        """The file's bytes; then the rest of the body is read (and checked) before the
        last chunk is handed over, so the object is published only for a well-formed body."""
        for event in events:
            if event[0] == _DATA:
                yield event[1]
            elif event[0] == _FILE_END:
                break
        _read_rest(events, purpose)

    checker = UploadChecker(purpose=purpose, max_bytes=max_bytes, max_line_bytes=max_line_bytes)
    stored = store.put_stream(key, checker.check(file_then_rest()))
    valid = checker.result()
    if stored != valid.bytes:  # pragma: no cover - put_stream wrote what it was given
        store.delete(key)
        raise RuntimeError(f"stored {stored} bytes of a {valid.bytes}-byte upload")
    return ReceivedUpload(valid, purpose, filename)


def _read_rest(events: Iterator[tuple], purpose: str | None) -> str | None:
    """Consume the events after the file; returns the purpose field seen last."""
    for event in events:
        if event[0] == _FILE:
            raise UploadRejected(422, "one file per upload", field="file")
        if event[0] == _FIELD and event[1] == "purpose":
            if purpose is not None and event[2] != purpose:
                raise UploadRejected(422, "purpose is given twice, differently", field="purpose")
            purpose = event[2]
    return purpose


def _receive_spooled(
    events: Iterator[tuple],
    filename: str | None,
    *,
    store: ObjectStore,
    key: str,
    max_bytes: int,
    max_line_bytes: int,
) -> ReceivedUpload:
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as spool:
        size = 0
        for event in events:
            if event[0] == _DATA:
                size += len(event[1])
                if size > max_bytes:
                    raise UploadRejected(413, f"file larger than {max_bytes} bytes")
                spool.write(event[1])
            elif event[0] == _FILE_END:
                break
        purpose = _read_rest(events, None)
        if purpose not in PURPOSES:
            raise FormInvalid(form_errors(has_file=True, purpose=purpose))
        spool.seek(0)
        valid = validate_upload(
            cast(BinaryIO, spool),
            purpose=purpose,
            max_bytes=max_bytes,
            max_line_bytes=max_line_bytes,
        )
        spool.seek(0)
        stored = store.put_stream(key, read_chunks(cast(BinaryIO, spool)))
        if stored != valid.bytes:  # pragma: no cover - the spool is ours alone
            store.delete(key)
            raise RuntimeError(f"stored {stored} bytes of a {valid.bytes}-byte upload")
    return ReceivedUpload(valid, purpose, filename)
