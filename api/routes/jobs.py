"""/v1/jobs: create, list, get, cancel, events (paged and streamed), metrics, checkpoints."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from sqlalchemy import Row, bindparam, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from api.deps import (
    CurrentTeam,
    IdempotencyDep,
    QueueDep,
    SessionDep,
    SettingsDep,
    StoreDep,
    autocommit_reads,
    end_transaction,
    enqueue_after_commit,
    request_hash,
)
from api.errors import api_error
from api.routes.evaluations import check_eval_file, check_judge
from api.schemas import (
    CheckpointOut,
    ErrorResponse,
    EventOut,
    JobOut,
    JobStatus,
    MetricOut,
    MetricsPage,
    Page,
)
from models import jobs as job_states
from models.tables import TERMINAL_STATUSES, Checkpoint, File, Job, JobEvent, JobMetric
from trainer.spec.job import JobSpec

router = APIRouter(prefix="/jobs", tags=["jobs"])
_ERRORS = {r: {"model": ErrorResponse} for r in (400, 401, 404, 409, 422, 429)}
_META_KEY = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_META_FILTER = re.compile(r"^metadata\[(.+)\]$")
MAX_META_VALUE = 512
SSE_BATCH = 500
JOB_OUT_COLUMNS = (
    Job.id, Job.status, Job.base_model, Job.objective, Job.meta, Job.attempt, Job.current_step,
    Job.total_steps, Job.error, Job.result, Job.created_at, Job.updated_at, Job.started_at,
    Job.finished_at, Job.spec,
)  # what JobOut.of reads
# A page of a team's jobs, newest first: columns, not ORM objects (no identity-map
# bookkeeping), and built once: constructing this select took a third of a listing's time.
_JOB_PAGE = (
    select(*JOB_OUT_COLUMNS)
    .where(Job.team_id == bindparam("team_id"))
    .order_by(Job.id.desc())
    .limit(bindparam("limit"))
)


def accepted_formats(spec: JobSpec) -> tuple[str, ...]:
    """Training-file formats the job can learn from (decided by the spec)."""
    return spec.training_formats


def get_owned_job(
    job_id: Annotated[str, Path(max_length=64)], team: CurrentTeam, session: SessionDep
) -> Job:
    """The team's job, or 404: another team's job is indistinguishable from no job."""
    job = session.get(Job, job_id)
    if job is None or job.team_id != team.id:
        raise api_error(404, f"no job {job_id!r}", field="job_id")
    return job


OwnedJob = Annotated[Job, Depends(get_owned_job)]


# --- create ----------------------------------------------------------------------------------


def _check_metadata(metadata: dict[str, str], limit: int) -> None:
    if len(metadata) > limit:
        raise api_error(422, f"at most {limit} metadata keys", field="metadata")
    for key, value in metadata.items():
        if not _META_KEY.match(key):
            raise api_error(
                422,
                "metadata keys are 1-64 characters of A-Z a-z 0-9 _ . -",
                field=f"metadata.{key}",
            )
        if len(value) > MAX_META_VALUE:
            raise api_error(
                422,
                f"metadata values are at most {MAX_META_VALUE} characters",
                field=f"metadata.{key}",
            )


def _check_reward_models(spec: JobSpec, allowed: tuple[str, ...]) -> None:
    """Reward-model checkpoints live on the workers: users name one an operator allowed."""
    for i, reward in enumerate(spec.online.rewards if spec.online else []):
        path = reward.options.get("path")
        if reward.name == "reward_model" and path not in allowed:
            raise api_error(
                422,
                f"reward model {path!r} is not allowed; one of: {', '.join(allowed) or '(none configured)'}",
                field=f"online.rewards.{i}.options.path",
            )


_TRAINING_FILE = select(File.id, File.team_id, File.purpose, File.status, File.format).where(
    File.id == bindparam("file_id")
)


def _training_file(session: Session, team_id: str, spec: JobSpec) -> Row:
    """The file row's checked columns (a statement built once: this runs on every create)."""
    row = session.execute(_TRAINING_FILE, {"file_id": spec.training_file}).one_or_none()
    if row is None or row.team_id != team_id:
        raise api_error(404, f"no file {spec.training_file!r}", field="training_file")
    if row.purpose != "train":
        raise api_error(
            422,
            f"file {row.id} was uploaded with purpose {row.purpose!r}; "
            "training files need purpose 'train'",
            field="training_file",
        )
    if row.status != "processed":
        raise api_error(422, f"file {row.id} is {row.status}, not processed", field="training_file")
    formats = accepted_formats(spec)
    if row.format not in formats:
        raise api_error(
            422,
            f"{spec.objective.name} ({spec.data_source}) trains on {' or '.join(formats)} "
            f"data; file {row.id} is {row.format}",
            field="training_file",
        )
    return row


@router.post("", status_code=201, response_model=JobOut, responses=_ERRORS)
def create_job(
    spec: JobSpec,
    team: CurrentTeam,
    session: SessionDep,
    settings: SettingsDep,
    queue: QueueDep,
    idem: IdempotencyDep,
):
    """Submit a training job: the body is a JobSpec whose `training_file` is a file id.

    The job is committed as `queued`, then handed to the workers."""
    # only a request with an Idempotency-Key is ever compared with another
    req_hash = request_hash(spec.model_dump(mode="json", exclude_unset=True)) if idem.key else ""
    if (replayed := idem.replay(req_hash)) is not None:
        return replayed
    if spec.base_model not in settings.allowed_base_models:
        raise api_error(
            422,
            f"unknown base_model {spec.base_model!r}; one of "
            f"{', '.join(settings.allowed_base_models)}",
            field="base_model",
        )
    _check_metadata(spec.metadata, settings.MAX_METADATA_KEYS)
    _check_reward_models(spec, settings.allowed_reward_models)
    for i, ev in enumerate(spec.evaluations):  # checked now, run when the job succeeds
        check_eval_file(session, team.id, ev, where=f"evaluations.{i}.")
        check_judge(ev, settings, where=f"evaluations.{i}.")
    training_file = _training_file(session, team.id, spec)
    job = job_states.create_job(
        session,
        team_id=team.id,
        spec=spec.model_dump(mode="json"),
        metadata=spec.metadata,
        training_file_id=training_file.id,
    )
    body = JobOut.of(job).model_dump(mode="json")
    # The quota check comes last: near the limit it locks the team's row until the commit
    # just below, so concurrent creates of one team wait for two statements, not the route.
    limit = settings.MAX_JOBS_PER_TEAM
    if not job_states.within_quota(session, team.id, limit):
        session.rollback()
        raise api_error(
            429,
            f"at most {limit} active jobs per team; wait for one to finish or cancel one",
            headers={"x-should-retry": "false"},  # a quota, not load: retrying cannot help
        )
    if (winner := idem.commit(req_hash, 201, body)) is not None:
        return winner
    enqueue_after_commit(queue, job.id)  # after the commit: the worker must find the row
    return Response(orjson.dumps(body), status_code=201, media_type="application/json")


# --- read --------------------------------------------------------------------------------------


@router.get("", response_model=Page[JobOut], responses=_ERRORS)
def list_jobs(
    request: Request,
    team: CurrentTeam,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=64, description="Cursor: a job id.")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    status: JobStatus | None = None,
):
    """Newest first. Filter with `status=` and any number of `metadata[key]=value`."""
    query = _JOB_PAGE
    if status is not None:
        query = query.where(Job.status == status)
    for name, value in request.query_params.multi_items():
        match = _META_FILTER.match(name)
        if match is None:
            continue
        key = match.group(1)
        if not _META_KEY.match(key):
            raise api_error(
                422, "metadata keys are 1-64 characters of A-Z a-z 0-9 _ . -", field=name
            )
        query = query.where(Job.meta[key].as_string() == value)
    if after is not None:
        query = query.where(Job.id < after)
    autocommit_reads(session)
    rows = session.execute(query, {"team_id": team.id, "limit": limit + 1}).all()
    end_transaction(session)
    data = [JobOut.of(r) for r in rows[:limit]]
    page = Page[JobOut](
        data=data,
        has_more=len(rows) > limit,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )
    # Serialised here, in this worker thread, by pydantic-core: returning the model would
    # make FastAPI validate the 20 jobs again, in one more thread hop, then encode them.
    return Response(page.model_dump_json(), media_type="application/json")


@router.get("/{job_id}", response_model=JobOut, responses=_ERRORS)
def get_job(job: OwnedJob):
    return JobOut.of(job)


@router.post("/{job_id}/cancel", response_model=JobOut, responses=_ERRORS)
def cancel_job(job: OwnedJob, session: SessionDep, idem: IdempotencyDep):
    """A queued job is cancelled at once; a running one becomes `cancelling` and stops at its
    next step boundary (saving a checkpoint). A finished job cannot be cancelled (409)."""
    req_hash = request_hash({"cancel": job.id})
    if (replayed := idem.replay(req_hash)) is not None:
        return replayed
    if job_states.request_cancel(session, job.id) is None:
        session.rollback()
        session.refresh(job)
        raise api_error(409, f"job {job.id} is already {job.status}", field="job_id")
    session.refresh(job)
    body = JobOut.of(job).model_dump(mode="json")
    if (winner := idem.commit(req_hash, 200, body)) is not None:
        return winner
    return JSONResponse(body)


@router.get("/{job_id}/events", response_model=Page[EventOut], responses=_ERRORS)
def list_events(
    job: OwnedJob,
    session: SessionDep,
    after: Annotated[int, Query(ge=0, description="Cursor: the last seq seen.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
):
    """Oldest first."""
    rows = list(
        session.execute(
            select(JobEvent)
            .where(JobEvent.job_id == job.id, JobEvent.seq > after)
            .order_by(JobEvent.seq)
            .limit(limit + 1)
        ).scalars()
    )
    data = [EventOut.of(r) for r in rows[:limit]]
    return Page[EventOut](
        data=data,
        has_more=len(rows) > limit,
        first_id=data[0].seq if data else None,
        last_id=data[-1].seq if data else None,
    )


def _poll(factory: sessionmaker[Session], job_id: str, after: int) -> tuple[str, list[EventOut]]:
    with factory() as session:
        # Status first: when it is terminal, its event is already committed and read below.
        status = session.execute(select(Job.status).where(Job.id == job_id)).scalar_one()
        rows = session.execute(
            select(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.seq > after)
            .order_by(JobEvent.seq)
            .limit(SSE_BATCH)
        ).scalars()
        return status, [EventOut.of(r) for r in rows]


def _sse(event: str, data: Any, id: int | None = None) -> str:
    head = f"id: {id}\n" if id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, default=str)}\n\n"


@router.get(
    "/{job_id}/events/stream", responses={200: {"content": {"text/event-stream": {}}}, **_ERRORS}
)
async def stream_events(
    job: OwnedJob,
    request: Request,
    settings: SettingsDep,
    after: Annotated[int, Query(ge=0)] = 0,
    last_event_id: Annotated[str | None, Header()] = None,
):
    """Server-sent events: one `event: <kind>` per job event (its `id` is the seq, so a
    reconnect with Last-Event-ID resumes), then `event: end` once the job is finished."""
    if last_event_id and last_event_id.isdigit():
        after = max(after, int(last_event_id))
    factory = request.app.state.session_factory
    job_id = job.id

    async def events():
        last = after
        quiet_since = time.monotonic()
        yield "retry: 3000\n\n"
        while True:
            status, batch = await run_in_threadpool(_poll, factory, job_id, last)
            for event in batch:
                last = event.seq
                yield _sse(event.kind, event.model_dump(mode="json"), event.seq)
            if batch:
                quiet_since = time.monotonic()
                if len(batch) == SSE_BATCH:
                    continue
            if status in TERMINAL_STATUSES:
                yield _sse("end", {"job_id": job_id, "status": status})
                return
            if await request.is_disconnected():
                return
            if time.monotonic() - quiet_since > settings.SSE_KEEPALIVE_SECONDS:
                quiet_since = time.monotonic()
                yield ": keepalive\n\n"
            await asyncio.sleep(settings.SSE_POLL_SECONDS)

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/{job_id}/metrics", response_model=MetricsPage, responses=_ERRORS)
def get_metrics(
    job: OwnedJob,
    session: SessionDep,
    from_step: Annotated[int, Query(ge=0)] = 0,
    to_step: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
):
    """Per-step training metrics with from_step <= step <= to_step, by step. For the next
    page, ask again with from_step = the last step + 1."""
    if to_step is not None and to_step < from_step:
        raise api_error(422, "to_step must not be below from_step", field="to_step")
    query = select(JobMetric).where(JobMetric.job_id == job.id, JobMetric.step >= from_step)
    if to_step is not None:
        query = query.where(JobMetric.step <= to_step)
    rows = list(session.execute(query.order_by(JobMetric.step).limit(limit + 1)).scalars())
    return MetricsPage(data=[MetricOut.of(r) for r in rows[:limit]], has_more=len(rows) > limit)


@router.get("/{job_id}/checkpoints", response_model=Page[CheckpointOut], responses=_ERRORS)
def list_checkpoints(job: OwnedJob, session: SessionDep):
    """Every saved checkpoint, by step."""
    rows = session.execute(
        select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(Checkpoint.step)
    ).scalars()
    data = [CheckpointOut.of(r) for r in rows]
    return Page[CheckpointOut](
        data=data,
        has_more=False,
        first_id=data[0].step if data else None,
        last_id=data[-1].step if data else None,
    )


_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


@router.get(
    "/{job_id}/checkpoints/{step}/download",
    status_code=200,
    responses={
        200: {"content": {"application/octet-stream": {}}},
        307: {"description": "Redirect to a presigned object-store URL (S3)."},
        **_ERRORS,
    },
)
def download_checkpoint_file(
    job: OwnedJob,
    session: SessionDep,
    store: StoreDep,
    settings: SettingsDep,
    step: Annotated[int, Path(ge=0)],
    file: Annotated[
        str, Query(min_length=1, max_length=255, description="A name from the checkpoint's files.")
    ],
):
    """One file of a checkpoint: a redirect to a presigned URL on S3, streamed otherwise.
    Only names that exist under the checkpoint's prefix are served (no path tricks)."""
    ckpt = session.execute(
        select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.step == step)
    ).scalar_one_or_none()
    if ckpt is None:
        raise api_error(404, f"job {job.id} has no checkpoint at step {step}", field="step")
    return _serve_file(store, settings, ckpt.object_prefix, file, f"checkpoint step {step}")


def _serve_file(store, settings, prefix: str, file: str, what: str):
    """A file listed under `prefix`: a redirect to a presigned URL on S3, streamed otherwise.
    Only names that exist under the prefix are served (no path tricks)."""
    names = {k.removeprefix(prefix) for k in store.list(prefix)}
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


@router.get("/{job_id}/model/download", responses=_ERRORS)
def download_model_file(
    job: OwnedJob,
    store: StoreDep,
    settings: SettingsDep,
    file: Annotated[
        str,
        Query(min_length=1, max_length=255, description="A name from result.final_model.files."),
    ],
):
    """One file of the job's exported model (an adapter or full model directory loadable by
    transformers/peft), once the job has succeeded."""
    final = (job.result or {}).get("final_model")
    if job.status != "succeeded" or not final:
        raise api_error(
            404, f"job {job.id} has no exported model (status {job.status})", field="job_id"
        )
    return _serve_file(store, settings, final["prefix"], file, "the exported model")
