"""Serving one stored file by name (checkpoint and model downloads)."""

from __future__ import annotations

import re

from fastapi.responses import RedirectResponse, Response, StreamingResponse

from api.errors import api_error
from models.settings import Settings
from storage import COMPLETE_MARKER, ObjectStore

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


def serve_file(
    store: ObjectStore, settings: Settings, prefix: str, file: str, what: str
) -> Response:
    """A file listed under `prefix`: a redirect to a presigned URL on S3, streamed otherwise.
    Only names that exist under the prefix are served (no path tricks)."""
    # the store's completion marker is ours, not the model's: never listed, never served
    names = {k.removeprefix(prefix) for k in store.list(prefix)} - {COMPLETE_MARKER}
    if file not in names:
        raise api_error(
            404,
            f"{what} has no file {file!r}; it has {', '.join(sorted(names)[:20]) or 'no files'}",
            field="file",
        )
    key = prefix + file
    url = store.presigned_url(key, expires=settings.PRESIGN_SECONDS)
    if url:
        return RedirectResponse(url, status_code=307)
    download_name = _SAFE_NAME.sub("_", file.rsplit("/", 1)[-1]) or "file"
    return StreamingResponse(
        store.get_stream(key),
        media_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{download_name}"'},
    )
