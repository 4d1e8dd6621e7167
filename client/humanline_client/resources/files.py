"""`client.files`: upload (validated by the server while it streams in), list, retrieve,
content, delete."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Optional, Union

from .._methods import endpoint, paged
from .._resource import APIResource, AsyncAPIResource, Listing, SyncAPIResource, path_id
from .._retries import NOT_GIVEN, RequestOptions
from .._steps import Steps
from ..types import FileDeleted, FileObject, FilePurpose

__all__ = ["AsyncFiles", "FileInput", "Files"]

# A path (str or PathLike), the bytes themselves, a binary file object, or (filename, content).
FileInput = Union[str, "os.PathLike[str]", bytes, IO[bytes], tuple[str, Union[bytes, IO[bytes]]]]
JSONL = "application/jsonl"


class _Multipart:
    """The `file` part of an upload, re-created for every attempt of the request: a retry
    must send the whole file again, so paths are reopened and file objects rewound."""

    def __init__(self, file: FileInput, filename: Optional[str]) -> None:
        self._path: Optional[Path] = None
        self._data: Optional[bytes] = None
        self._fh: Optional[IO[bytes]] = None
        self._start = 0
        self._opened: list[IO[bytes]] = []
        name: Optional[str] = None
        if isinstance(file, tuple):
            name, file = file
        if isinstance(file, (str, os.PathLike)):
            self._path = Path(file)
            if not self._path.is_file():
                raise FileNotFoundError(f"no such file: {self._path}")
            name = name or self._path.name
        elif isinstance(file, (bytes, bytearray, memoryview)):
            self._data = bytes(file)
        elif hasattr(file, "read"):
            if isinstance(getattr(file, "name", None), str):
                name = name or os.path.basename(file.name)
            seekable = getattr(file, "seekable", lambda: False)()
            if seekable:
                self._fh = file
                self._start = file.tell()
            else:  # a pipe: keep it in memory so that a retry can send it again
                data = file.read()
                self._data = data.encode() if isinstance(data, str) else data
        else:
            raise TypeError(f"file must be a path, bytes or a binary file object, not {type(file)}")
        self.filename = filename or name or "upload.jsonl"

    def __call__(self) -> Mapping[str, Any]:
        if self._path is not None:
            content: Any = open(self._path, "rb")  # noqa: SIM115 - closed by close()
            self._opened.append(content)
        elif self._fh is not None:
            self._fh.seek(self._start)
            content = self._fh
        else:
            content = io.BytesIO(self._data or b"")
        return {"file": (self.filename, content, JSONL)}

    def close(self) -> None:
        for fh in self._opened:
            fh.close()
        self._opened.clear()


class _Files(APIResource):
    @endpoint
    def upload(
        self,
        *,
        file: FileInput,
        purpose: FilePurpose = "train",
        filename: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        timeout: Any = NOT_GIVEN,
    ) -> Steps[FileObject]:
        """Upload a JSONL file (`purpose="train"` for training data, `"eval"` for evaluation
        sets). The server validates every line; a bad file raises UnprocessableEntityError
        whose `errors` list the bad lines ({"line", "field", "message"})."""
        part = _Multipart(file, filename)
        opts = RequestOptions(
            "POST",
            "/v1/files",
            data={"purpose": purpose},
            files=part,
            idempotency_key=idempotency_key,
            timeout=timeout,
        )
        try:
            return (yield from self._call(FileObject, opts))
        finally:
            part.close()

    @paged
    def list(
        self, *, purpose: Optional[FilePurpose] = None, limit: int = 20, after: Optional[str] = None
    ) -> Listing[FileObject]:
        """Files, newest first (lazy: iterate, or `.first_page()`). `limit` is the page size."""
        return Listing(
            "/v1/files", FileObject, {"purpose": purpose, "limit": limit, "after": after}
        )

    @endpoint
    def retrieve(self, file_id: str) -> Steps[FileObject]:
        return (yield from self._get(f"/v1/files/{path_id(file_id, 'file')}", FileObject))

    @endpoint
    def content(
        self, file_id: str, *, to: Union[str, os.PathLike[str], None] = None
    ) -> Steps[Union[bytes, Path]]:
        """The file's bytes, or with `to=` streamed into that path (returned as a Path)."""
        opts = RequestOptions("GET", f"/v1/files/{path_id(file_id, 'file')}/content")
        opts.headers["Accept"] = "*/*"
        return (yield from self._download(opts, to))

    @endpoint
    def delete(self, file_id: str) -> Steps[FileDeleted]:
        """Delete a file and its bytes (ConflictError while an active job trains on it)."""
        opts = RequestOptions("DELETE", f"/v1/files/{path_id(file_id, 'file')}")
        return (yield from self._call(FileDeleted, opts))


class Files(_Files, SyncAPIResource):
    """`client.files`: upload, list, retrieve, content, delete."""


class AsyncFiles(_Files, AsyncAPIResource):
    """`aclient.files`: the same methods, awaited (`list` is an async paginator)."""
