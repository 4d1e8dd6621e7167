"""/v1/files: upload (validated while streaming), list, get, download, delete."""

from __future__ import annotations

import logging
import os
import re
from typing import Annotated, Literal

from fastapi import APIRouter, Form, Query, UploadFile
from fastapi import File as FileParam
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy import select

from api.deps import CurrentTeam, IdempotencyDep, SessionDep, SettingsDep, StoreDep, request_hash
from api.errors import api_error
from api.schemas import Deleted, ErrorResponse, FileOut, Page
from api.uploads import UploadRejected, read_chunks, validate_upload
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


@router.post("", status_code=201, response_model=FileOut, responses=_ERRORS)
def upload_file(
    team: CurrentTeam,
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
    idem: IdempotencyDep,
    file: Annotated[UploadFile, FileParam(description="A JSONL file (DESIGN.md §3).")],
    purpose: Annotated[Literal["train", "eval"], Form()],
):
    """Upload a JSONL file. It is validated line by line as it streams in; an invalid file is
    refused with every bad line (up to 20) and leaves nothing behind."""
    try:
        valid = validate_upload(
            file.file,
            purpose=purpose,
            max_bytes=settings.MAX_UPLOAD_BYTES,
            max_line_bytes=settings.MAX_LINE_BYTES,
        )
    except UploadRejected as rejected:
        raise api_error(
            rejected.status,
            rejected.message,
            field="file" if rejected.status == 413 else None,
            errors=rejected.errors or None,
        ) from None
    filename = _display_name(file.filename)
    req_hash = request_hash({"purpose": purpose, "filename": filename, "sha256": valid.sha256})
    if (replayed := idem.replay(req_hash)) is not None:
        return replayed
    file_id = new_id("file")
    key = file_key(team.id, file_id)
    file.file.seek(0)  # pass 2: the validated bytes, straight to their final key (atomic)
    stored = store.put_stream(key, read_chunks(file.file))
    try:
        if stored != valid.bytes:  # the spool file changed under us: refuse to publish it
            raise RuntimeError(f"stored {stored} bytes of a {valid.bytes}-byte upload")
        row = File(
            id=file_id,
            team_id=team.id,
            filename=filename,
            purpose=purpose,
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
    except BaseException:
        session.rollback()
        store.delete(key)
        raise
    if winner is not None:  # a concurrent retry with the same key stored its file first
        store.delete(key)
        return winner
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
