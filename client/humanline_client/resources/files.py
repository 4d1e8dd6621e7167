"""`client.files`: upload (validated by the server while it streams in), list, retrieve,
content, delete."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Optional, Union

from .._base_client import NOT_GIVEN, RequestOptions
from .._resource import AsyncAPIResource, SyncAPIResource, path_id
from ..pagination import AsyncPaginator, SyncPaginator
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


def _list_params(purpose: Optional[str], limit: int, after: Optional[str]) -> dict:
    return {"purpose": purpose, "limit": limit, "after": after}


class Files(SyncAPIResource):
    def upload(
        self,
        *,
        file: FileInput,
        purpose: FilePurpose = "train",
        filename: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        timeout: Any = NOT_GIVEN,
    ) -> FileObject:
        """Upload a JSONL file (`purpose="train"` for training data, `"eval"` for evaluation
        sets). The server validates every line; a bad file raises UnprocessableEntityError
        whose `errors` list the bad lines ({"line", "field", "message"})."""
        part = _Multipart(file, filename)
        try:
            return self._client._call(
                FileObject,
                RequestOptions(
                    "POST",
                    "/v1/files",
                    data={"purpose": purpose},
                    files=part,
                    idempotency_key=idempotency_key,
                    timeout=timeout,
                ),
            )
        finally:
            part.close()

    def list(
        self, *, purpose: Optional[FilePurpose] = None, limit: int = 20, after: Optional[str] = None
    ) -> SyncPaginator[FileObject]:
        """Files, newest first (lazy: iterate, or `.first_page()`). `limit` is the page size."""
        return self._paginate("/v1/files", FileObject, _list_params(purpose, limit, after))

    def retrieve(self, file_id: str) -> FileObject:
        return self._client._get(f"/v1/files/{path_id(file_id, 'file')}", FileObject)

    def content(
        self, file_id: str, *, to: Union[str, os.PathLike[str], None] = None
    ) -> Union[bytes, Path]:
        """The file's bytes, or with `to=` streamed into that path (returned as a Path)."""
        opts = RequestOptions("GET", f"/v1/files/{path_id(file_id, 'file')}/content")
        opts.headers["Accept"] = "*/*"
        return self._client._download(opts, to)

    def delete(self, file_id: str) -> FileDeleted:
        """Delete a file and its bytes (ConflictError while an active job trains on it)."""
        return self._client._call(
            FileDeleted, RequestOptions("DELETE", f"/v1/files/{path_id(file_id, 'file')}")
        )


class AsyncFiles(AsyncAPIResource):
    async def upload(
        self,
        *,
        file: FileInput,
        purpose: FilePurpose = "train",
        filename: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        timeout: Any = NOT_GIVEN,
    ) -> FileObject:
        part = _Multipart(file, filename)
        try:
            return await self._client._call(
                FileObject,
                RequestOptions(
                    "POST",
                    "/v1/files",
                    data={"purpose": purpose},
                    files=part,
                    idempotency_key=idempotency_key,
                    timeout=timeout,
                ),
            )
        finally:
            part.close()

    def list(
        self, *, purpose: Optional[FilePurpose] = None, limit: int = 20, after: Optional[str] = None
    ) -> AsyncPaginator[FileObject]:
        return self._paginate("/v1/files", FileObject, _list_params(purpose, limit, after))

    async def retrieve(self, file_id: str) -> FileObject:
        return await self._client._get(f"/v1/files/{path_id(file_id, 'file')}", FileObject)

    async def content(
        self, file_id: str, *, to: Union[str, os.PathLike[str], None] = None
    ) -> Union[bytes, Path]:
        opts = RequestOptions("GET", f"/v1/files/{path_id(file_id, 'file')}/content")
        opts.headers["Accept"] = "*/*"
        return await self._client._download(opts, to)

    async def delete(self, file_id: str) -> FileDeleted:
        return await self._client._call(
            FileDeleted, RequestOptions("DELETE", f"/v1/files/{path_id(file_id, 'file')}")
        )
