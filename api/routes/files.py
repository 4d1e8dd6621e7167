"""/v1/files: upload (validated while streaming), list, get, download, delete."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import replace
from functools import partial

import anyio
from anyio import CapacityLimiter
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.bodypump import BodyPump
from api.deps import (
    CurrentTeam,
    Idempotency,
    IdempotencyDep,
    SessionDep,
    SettingsDep,
    StoreDep,
    end_transaction,
)
from api.errors import api_error
from api.limits import upload_limiter
from api.owned import OwnedFile
from api.paging import DEFAULT_LIMIT, Cursor, Limit, fetch_page, where_given
from api.schemas import Deleted, FileOut, Page, error_responses
from api.uploads import (
    PURPOSES,
    FormInvalid,
    ReceivedUpload,
    UploadRejected,
    form_errors,
    multipart_boundary,
    receive_upload,
)
from models.base import new_id
from models.quota import StorageUse, storage_use, within_storage_quota
from models.settings import GiB, MiB, Settings
from models.tables import ACTIVE_STATUSES, File, FilePurpose, Job
from storage import ObjectNotFound, ObjectStore
from storage.keys import file_key

router = APIRouter(prefix="/files", tags=["files"])
log = logging.getLogger("humanline.api")
_ERRORS = error_responses(400, 401, 404, 409, 413, 422)
_UPLOAD_ERRORS = {**_ERRORS, **error_responses(408, 429, 503)}
_CLOSE = {"Connection": "close"}  # an unread body is not worth receiving
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")


def _display_name(filename: str | None) -> str:
    """Keep the client's name for display only (keys never use it): base name, no controls."""
    name = _UNSAFE.sub("", os.path.basename((filename or "").replace("\\", "/"))).strip()
    return name[:255] or "upload.jsonl"


_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "purpose": {
                            "type": "string",
                            "enum": list(PURPOSES),
                            "description": "train or eval; send it before the file to have "
                            "the file validated while it streams in.",
                        },
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "A JSONL file (DESIGN.md §3).",
                        },
                    },
                }
            }
        },
    }
}


@router.post(
    "", status_code=201, response_model=FileOut, responses=_UPLOAD_ERRORS,
    openapi_extra=_UPLOAD_BODY,
)
async def upload_file(
    request: Request,
    team: CurrentTeam,
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
    idem: IdempotencyDep,
):
    """Upload a JSONL file (multipart: `purpose`, then `file`). It is validated line by line
    and written to the object store as it streams in; an invalid file is refused with every
    bad line (up to 20) and leaves nothing behind.

    A team may have UPLOAD_MAX_PER_TEAM uploads in progress at once (more: 429 with
    Retry-After), the server UPLOAD_MAX_CONCURRENT (more: 503). An upload whose client sends
    nothing for UPLOAD_IDLE_TIMEOUT_S seconds is answered 408 and leaves nothing behind."""
    slot = upload_limiter(request.app.state).acquire(team.id, headers=_CLOSE)
    try:
        return await _upload(request, team.id, session, settings, store, idem)
    finally:
        slot.release()


async def _upload(
    request: Request,
    team_id: str,
    session: Session,
    settings: Settings,
    store: ObjectStore,
    idem: Idempotency,
):
    try:
        boundary = multipart_boundary(request.headers.get("content-type", ""))
    except UploadRejected as rejected:
        raise _upload_error(rejected) from None
    if boundary is None:  # not multipart: there is no file (FastAPI's errors for the form)
        form = await request.form()
        purpose = form.get("purpose")
        raise RequestValidationError(
            form_errors(has_file=False, purpose=purpose if isinstance(purpose, str) else None)
        )
    # The team's storage quota: a team at its quota is refused before a byte is read, and
    # no upload may stream past the room left (counted again, exactly, before the commit).
    quota = int(settings.TEAM_STORAGE_QUOTA_GIB * GiB)
    used = await run_in_threadpool(storage_use, session, team_id)
    room = quota - used.total
    if room <= 0:
        raise _over_quota(quota, used)
    max_bytes = min(settings.MAX_UPLOAD_BYTES, room)
    # The upload may take seconds: hold no connection meanwhile (auth opened a transaction).
    await run_in_threadpool(end_transaction, session)
    request.state.db_slot.release()
    file_id = new_id("file")
    key = file_key(team_id, file_id)
    try:
        async with BodyPump(request.stream(), idle_timeout=settings.UPLOAD_IDLE_TIMEOUT_S) as pump:
            # Wait for bytes in the event loop: a slow client holds no thread meanwhile.
            await pump.first_block()
            # Then a thread of the upload's own (bounded by the slots above), never one of
            # the request pool's: an upload trickling in cannot starve other requests.
            received = await anyio.to_thread.run_sync(
                partial(
                    receive_upload,
                    pump.chunks(),
                    boundary,
                    store=store,
                    key=key,
                    max_bytes=max_bytes,
                    max_line_bytes=settings.MAX_LINE_BYTES,
                ),
                limiter=CapacityLimiter(1),
            )
    except UploadRejected as rejected:
        if rejected.status == 413 and max_bytes < settings.MAX_UPLOAD_BYTES:
            raise _over_quota(quota, used, f"more than the {_size(room)} left") from None
        raise _upload_error(rejected) from None
    except FormInvalid as invalid:
        raise RequestValidationError(invalid.errors) from None
    await request.state.db_slot.acquire()
    try:  # the object is stored: from here, any failure must remove it
        return await run_in_threadpool(
            _register_upload, session, team_id, idem, file_id, key, received, quota
        )
    except _Replayed as replayed:  # this Idempotency-Key already has its file
        await run_in_threadpool(store.delete, key)
        return replayed.response
    except _OverQuota as over:  # concurrent uploads filled the room meanwhile
        await run_in_threadpool(store.delete, key)
        size = received.valid.bytes
        before = replace(over.use, files=over.use.files - size)  # without this upload's row
        raise _over_quota(quota, before, _size(size)) from None
    except BaseException:
        store.delete(key)
        raise


def _size(n: int) -> str:
    if n >= GiB // 10:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.2f} MiB" if n >= MiB else f"{n} bytes"


def _over_quota(quota: int, use: StorageUse, upload: str | None = None):
    """413 naming the quota and what fills it; nothing of the upload is kept."""
    what = f"this upload ({upload}) would take" if upload else "this upload would take"
    return api_error(
        413,
        f"{what} the team's stored bytes past its storage quota of {_size(quota)}: "
        f"{_size(use.total)} are stored (files {_size(use.files)}, checkpoints "
        f"{_size(use.checkpoints)}, models {_size(use.models)}); delete files to make room",
        type="storage_quota_exceeded",
        field="file",
        headers={"x-should-retry": "false"},  # a quota, not load: retrying cannot help
    )


class _OverQuota(Exception):
    def __init__(self, use: StorageUse):
        self.use = use


class _Replayed(Exception):
    def __init__(self, response: JSONResponse):
        self.response = response


def _upload_error(rejected: UploadRejected):
    field = rejected.field or ("file" if rejected.status == 413 else None)
    # 408: the client may still send its body; close the connection instead of reading it
    headers = _CLOSE if rejected.status == 408 else None
    return api_error(
        rejected.status, rejected.message, field=field, errors=rejected.errors or None,
        headers=headers,
    )


def _register_upload(
    session, team_id: str, idem, file_id: str, key: str, received: ReceivedUpload, quota: int
):
    """The file's row (or an idempotent replay), once its object is stored under `key`; the
    storage quota is checked last, after the insert and under the team's lock
    (models.quota.within_storage_quota), so concurrent uploads never go past it together."""
    valid = received.valid
    filename = _display_name(received.filename)
    request = {"purpose": received.purpose, "filename": filename, "sha256": valid.sha256}
    try:
        if (replayed := idem.replay(request)) is not None:
            raise _Replayed(replayed)
        row = File(
            id=file_id,
            team_id=team_id,
            filename=filename,
            purpose=received.purpose,
            bytes=valid.bytes,
            sha256=valid.sha256,
            format=valid.format,
            records=valid.records,
            warnings=list(valid.warnings) or None,
            item_fields=valid.fields,
            status="processed",
            object_key=key,
        )
        session.add(row)
        session.flush()
        within, use = within_storage_quota(session, team_id, quota)
        if not within:
            raise _OverQuota(use)
        body = FileOut.of(row).model_dump(mode="json")
        winner = idem.commit(201, body)
    except _Replayed:
        raise
    except BaseException:
        session.rollback()
        raise
    if winner is not None:  # a concurrent retry with the same key stored its file first
        raise _Replayed(winner)
    log.info(
        "file uploaded",
        extra={
            "file_id": file_id,
            "bytes": valid.bytes,
            "records": valid.records,
            "format": valid.format,
        },
    )
    return JSONResponse(body, status_code=201)


@router.get("", response_model=Page[FileOut], responses=_ERRORS)
def list_files(
    team: CurrentTeam,
    session: SessionDep,
    after: Cursor = None,
    limit: Limit = DEFAULT_LIMIT,
    purpose: FilePurpose | None = None,
):
    """Newest first."""
    query = where_given(select(File).where(File.team_id == team.id), (File.purpose, purpose))
    return fetch_page(session, query, File.id, after, limit, FileOut)


@router.get("/{file_id}", response_model=FileOut, responses=_ERRORS)
def get_file(file: OwnedFile):
    return FileOut.of(file)


@router.get(
    "/{file_id}/content", responses={200: {"content": {"application/jsonl": {}}}, **_ERRORS}
)
def get_file_content(row: OwnedFile, store: StoreDep):
    """The uploaded bytes, streamed."""
    file_id = row.id
    try:
        chunks = store.get_stream(row.object_key)
    except ObjectNotFound:
        log.error("file row without its object", extra={"file_id": file_id})
        raise api_error(
            404, f"the content of file {file_id} is missing", field="file_id"
        ) from None
    return StreamingResponse(
        chunks,
        media_type="application/jsonl",
        headers={
            "Content-Length": str(row.bytes),
            "Content-Disposition": f'attachment; filename="{row.id}.jsonl"',
        },
    )


@router.delete("/{file_id}", response_model=Deleted, responses=_ERRORS)
def delete_file(row: OwnedFile, session: SessionDep, store: StoreDep):
    """Delete a file and its bytes; refused (409) while an active job trains on it."""
    file_id = row.id
    busy = session.execute(
        select(Job.id)
        .where(Job.training_file_id == row.id, Job.status.in_(ACTIVE_STATUSES))
        .limit(1)
    ).scalar()
    if busy is not None:
        raise api_error(409, f"file {file_id} is used by active job {busy}", field="file_id")
    key = row.object_key
    session.delete(row)
    session.commit()
    try:
        store.delete(key)
    except Exception:  # the row is gone; an orphan object is harmless and logged
        log.exception("could not delete object of a deleted file", extra={"file_id": file_id})
    return Deleted(id=file_id, object="file")
