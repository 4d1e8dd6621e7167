"""/v1/files: upload (validated while streaming), list, get, download, delete."""

from __future__ import annotations

import logging
import os
import re
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from api.deps import (
    CurrentTeam,
    IdempotencyDep,
    SessionDep,
    SettingsDep,
    StoreDep,
    end_transaction,
    request_hash,
)
from api.errors import api_error
from api.schemas import Deleted, ErrorResponse, FileOut, Page
from api.uploads import (
    PURPOSES,
    BodyPump,
    FormInvalid,
    ReceivedUpload,
    UploadRejected,
    form_errors,
    multipart_boundary,
    receive_upload,
)
from models.base import new_id
from models.tables import ACTIVE_STATUSES, File, Job
from storage import ObjectNotFound
from storage.keys import file_key

router = APIRouter(prefix="/files", tags=["files"])
log = logging.getLogger("humanline.api")
_ERRORS = {r: {"model": ErrorResponse} for r in (400, 401, 404, 409, 413, 422)}
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")


def _display_name(filename: str | None) -> str:
    """Keep the client's name for display only (keys never use it): base name, no controls."""
    name = _UNSAFE.sub("", os.path.basename((filename or "").replace("\\", "/"))).strip()
    return name[:255] or "upload.jsonl"


def _own_file(session, team_id: str, file_id: str) -> File:
    row = session.get(File, file_id)
    if row is None or row.team_id != team_id:
        raise api_error(404, f"no file {file_id!r}", field="file_id")
    return row


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
    "", status_code=201, response_model=FileOut, responses=_ERRORS, openapi_extra=_UPLOAD_BODY
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
    bad line (up to 20) and leaves nothing behind."""
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
    # The upload may take seconds: hold no connection meanwhile (auth opened a transaction).
    await run_in_threadpool(end_transaction, session)
    request.state.db_slot.release()
    file_id = new_id("file")
    key = file_key(team.id, file_id)
    try:
        async with BodyPump(request.stream()) as pump:
            received = await run_in_threadpool(
                receive_upload,
                pump.chunks(),
                boundary,
                store=store,
                key=key,
                max_bytes=settings.MAX_UPLOAD_BYTES,
                max_line_bytes=settings.MAX_LINE_BYTES,
            )
    except UploadRejected as rejected:
        raise _upload_error(rejected) from None
    except FormInvalid as invalid:
        raise RequestValidationError(invalid.errors) from None
    await request.state.db_slot.acquire()
    try:  # the object is stored: from here, any failure must remove it
        return await run_in_threadpool(
            _register_upload, session, team.id, idem, file_id, key, received
        )
    except _Replayed as replayed:  # this Idempotency-Key already has its file
        await run_in_threadpool(store.delete, key)
        return replayed.response
    except BaseException:
        store.delete(key)
        raise


class _Replayed(Exception):
    def __init__(self, response: JSONResponse):
        self.response = response


def _upload_error(rejected: UploadRejected):
    field = rejected.field or ("file" if rejected.status == 413 else None)
    return api_error(rejected.status, rejected.message, field=field, errors=rejected.errors or None)


def _register_upload(session, team_id: str, idem, file_id: str, key: str, received: ReceivedUpload):
    """The file's row (or an idempotent replay), once its object is stored under `key`."""
    valid = received.valid
    filename = _display_name(received.filename)
    req_hash = request_hash(
        {"purpose": received.purpose, "filename": filename, "sha256": valid.sha256}
    )
    try:
        if (replayed := idem.replay(req_hash)) is not None:
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
            status="processed",
            object_key=key,
        )
        session.add(row)
        session.flush()
        body = FileOut.of(row).model_dump(mode="json")
        winner = idem.commit(req_hash, 201, body)
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
    after: Annotated[str | None, Query(max_length=64, description="Cursor: a file id.")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    purpose: Literal["train", "eval"] | None = None,
):
    """Newest first."""
    query = select(File).where(File.team_id == team.id)
    if purpose is not None:
        query = query.where(File.purpose == purpose)
    if after is not None:
        query = query.where(File.id < after)
    rows = list(session.execute(query.order_by(File.id.desc()).limit(limit + 1)).scalars())
    data = [FileOut.of(r) for r in rows[:limit]]
    return Page[FileOut](
        data=data,
        has_more=len(rows) > limit,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )


@router.get("/{file_id}", response_model=FileOut, responses=_ERRORS)
def get_file(file_id: str, team: CurrentTeam, session: SessionDep):
    return FileOut.of(_own_file(session, team.id, file_id))


@router.get(
    "/{file_id}/content", responses={200: {"content": {"application/jsonl": {}}}, **_ERRORS}
)
def get_file_content(file_id: str, team: CurrentTeam, session: SessionDep, store: StoreDep):
    """The uploaded bytes, streamed."""
    row = _own_file(session, team.id, file_id)
    try:
        chunks = store.get_stream(row.object_key)
    except ObjectNotFound:
        log.error("file row without its object", extra={"file_id": file_id})
        raise api_error(404, f"the content of file {file_id} is missing", field="file_id")
    return StreamingResponse(
        chunks,
        media_type="application/jsonl",
        headers={
            "Content-Length": str(row.bytes),
            "Content-Disposition": f'attachment; filename="{row.id}.jsonl"',
        },
    )


@router.delete("/{file_id}", response_model=Deleted, responses=_ERRORS)
def delete_file(file_id: str, team: CurrentTeam, session: SessionDep, store: StoreDep):
    """Delete a file and its bytes; refused (409) while an active job trains on it."""
    row = _own_file(session, team.id, file_id)
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
