"""/v1/jobs: create, list, get, cancel, events (paged and streamed), metrics, checkpoints."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from typing import Annotated, Any

import anyio
import orjson
from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session, sessionmaker

from api.admission import admit, check_job, check_meta_key
from api.deps import (
    CurrentTeam,
    Idempotency,
    IdempotencyDep,
    SessionDep,
    SettingsDep,
    StoreDep,
    autocommit_reads,
    end_transaction,
)
from api.downloads import serve_file
from api.errors import api_error
from api.estimates import stored_estimate
from api.limits import SlotStreamingResponse, StreamSlot, stream_poll_limiter
from api.owned import OwnedJob, get_owned_job  # noqa: F401 (get_owned_job: re-exported)
from api.paging import DEFAULT_LIMIT, Cursor, Limit, page_of, where_given
from api.queues import QueueDep, enqueue_after_commit
from api.schemas import (
    CheckpointOut,
    EstimateOut,
    EventOut,
    JobOut,
    JobStatus,
    MetricOut,
    MetricsPage,
    Page,
    TrainingOut,
    error_responses,
)
from contract.estimate import JobEstimate
from contract.spec import INT4_MAX, JobSpec
from models import jobs as job_states
from models.tables import TERMINAL_STATUSES, Job

router = APIRouter(prefix="/jobs", tags=["jobs"])
_ERRORS = error_responses(400, 401, 404, 409, 422, 429)
_META_FILTER = re.compile(r"^metadata\[(.+)\]$")
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
    if (replayed := idem.replay(spec)) is not None:
        return replayed
    job, estimate = admit(spec, team.id, session, settings)
    out = JobOut.of(job)
    out.estimate = estimate
    body = out.model_dump(mode="json")
    # Rendered before the commit: nothing may fail once the job is committed and enqueued.
    content = orjson.dumps(body)
    if (winner := idem.commit(201, body)) is not None:
        return winner
    enqueue_after_commit(queue, job.id)  # after the commit: the worker must find the row
    return Response(content, status_code=201, media_type="application/json")


@router.post("/estimate", response_model=EstimateOut, responses=_ERRORS)
def estimate_job(spec: JobSpec, team: CurrentTeam, session: SessionDep, settings: SettingsDep):
    """What a job would cost, before it is created: the same body and the same checks (and
    4xx) as POST /v1/jobs, but nothing is written. Returns the resolved spec, the micro-batch,
    steps, training tokens (approximated from the file's size: `tokens_method`), memory per
    process, GPUs, and the predicted wall-clock and GPU-hours on this deployment's job queue
    (JOB_DEVICE_KIND; docs/estimates.md)."""
    try:
        checked = check_job(spec, team.id, session, settings)
        estimate = checked.estimate(settings)
    finally:
        session.rollback()  # nothing of an estimate is ever committed
    if estimate is None:
        raise api_error(
            422,
            f"base_model {spec.base_model!r} cannot be estimated: its config.json is not "
            "readable by the API",
            field="base_model",
        )
    return EstimateOut(
        **estimate.model_dump(),
        spec=checked.spec.model_dump(mode="json"),
        warnings=[message for message, _ in checked.warnings],
    )


def _estimate_of(session: Session, job_id: str) -> JobEstimate | None:
    data = stored_estimate(session, job_id)
    try:
        return None if data is None else JobEstimate.model_validate(data)
    except ValueError:  # kept by another version of the estimate: not shown rather than a 500
        return None


# --- read --------------------------------------------------------------------------------------


@router.get("", response_model=Page[JobOut], responses=_ERRORS)
def list_jobs(
    request: Request,
    team: CurrentTeam,
    session: SessionDep,
    after: Cursor = None,
    limit: Limit = DEFAULT_LIMIT,
    status: JobStatus | None = None,
):
    """Newest first. Filter with `status=` and any number of `metadata[key]=value`."""
    query = where_given(_JOB_PAGE, (Job.status, status))
    for name, value in request.query_params.multi_items():
        match = _META_FILTER.match(name)
        if match is None:
            continue
        key = match.group(1)
        check_meta_key(key, name)
        query = query.where(Job.meta[key].as_string() == value)
    if after is not None:
        query = query.where(Job.id < after)
    autocommit_reads(session)
    rows = session.execute(query, {"team_id": team.id, "limit": limit + 1}).all()
    end_transaction(session)
    page = page_of(rows, limit, JobOut)
    # Serialised here, in this worker thread, by pydantic-core: returning the model would
    # make FastAPI validate the 20 jobs again, in one more thread hop, then encode them.
    return Response(page.model_dump_json(), media_type="application/json")


@router.get("/{job_id}", response_model=JobOut, responses=_ERRORS)
def get_job(job: OwnedJob, session: SessionDep):
    """The job, with `training`: the trainer's choice of micro-batch (one more query, on the
    job's events: lists leave it null rather than make one per job)."""
    training = job_states.training_choice(session, job.id)
    out = JobOut.of(job)
    out.training = None if training is None else TrainingOut(**training)
    out.estimate = _estimate_of(session, job.id)
    return out


@router.post("/{job_id}/cancel", response_model=JobOut, responses=_ERRORS)
def cancel_job(job: OwnedJob, session: SessionDep, idem: IdempotencyDep):
    """A queued job is cancelled at once; a running one becomes `cancelling` and stops at its
    next step boundary (saving a checkpoint). A finished job cannot be cancelled (409)."""
    return cancel_with(job, session, idem, lambda j: JobOut.of(j).model_dump(mode="json"))


def cancel_with(
    job: Job, session: Session, idem: Idempotency, render: Callable[[Job], dict[str, Any]],
    field: str = "job_id",
) -> Response:
    """Cancel `job` (idempotently), answering with `render(job)`: both job shapes cancel here."""
    if (replayed := idem.replay({"cancel": job.id})) is not None:
        return replayed
    if job_states.request_cancel(session, job.id) is None:
        session.rollback()
        session.refresh(job)
        raise api_error(409, f"job {job.id} is already {job.status}", field=field)
    session.refresh(job)
    body = render(job)
    if (winner := idem.commit(200, body)) is not None:
        return winner
    return JSONResponse(body)


@router.get("/{job_id}/events", response_model=Page[EventOut], responses=_ERRORS)
def list_events(
    job: OwnedJob,
    session: SessionDep,
    after: Annotated[int, Query(ge=0, le=INT4_MAX, description="Cursor: the last seq seen.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
):
    """Oldest first."""
    rows = job_states.events_after(session, job.id, after, limit + 1)
    return page_of(rows, limit, EventOut, "seq")


def _poll(factory: sessionmaker[Session], job_id: str, after: int) -> tuple[str, list[EventOut]]:
    with factory() as session:
        # Status first: when it is terminal, its event is already committed and read below.
        status = session.execute(select(Job.status).where(Job.id == job_id)).scalar_one()
        rows = job_states.events_after(session, job_id, after, SSE_BATCH)
        return status, [EventOut.of(r) for r in rows]


def _sse(event: str, data: Any, id: int | None = None) -> str:
    head = f"id: {id}\n" if id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, default=str)}\n\n"


_EVENT_ID = re.compile(r"[0-9]{1,10}")  # ASCII only: str.isdigit() takes "١" and "²"


def _last_event_id(header: str | None) -> int:
    """The seq a reconnecting client last saw (0 when none). Our ids are seqs, so anything
    else (non-ASCII digits, 5,000 digits, past int4) was not sent by us: 400, never a 500
    from int() or from the database once the stream has started."""
    if not header:
        return 0
    if _EVENT_ID.fullmatch(header) is None or int(header) > INT4_MAX:
        raise api_error(
            400, "Last-Event-ID must be an event id this stream sent (an integer seq)",
            field="Last-Event-ID",
        )
    return int(header)


@router.get(
    "/{job_id}/events/stream",
    responses={200: {"content": {"text/event-stream": {}}}, **_ERRORS, **error_responses(503)},
)
async def stream_events(
    slot: StreamSlot,  # first: over the cap is refused before the job is looked up
    job: OwnedJob,
    request: Request,
    settings: SettingsDep,
    after: Annotated[int, Query(ge=0, le=INT4_MAX)] = 0,
    last_event_id: Annotated[str | None, Header()] = None,
):
    """Server-sent events: one `event: <kind>` per job event (its `id` is the seq, so a
    reconnect with Last-Event-ID resumes), then `event: end` once the job is finished.

    A team may hold STREAMS_PER_TEAM streams open at once (more: 429 with Retry-After), the
    server STREAMS_TOTAL (more: 503); a stream's slot is free again as soon as its client
    disconnects."""
    after = max(after, _last_event_id(last_event_id))
    factory = request.app.state.session_factory
    polls = stream_poll_limiter(request.app.state)
    job_id = job.id

    async def events():
        last = after
        quiet_since = time.monotonic()
        yield "retry: 3000\n\n"
        while True:
            status, batch = await anyio.to_thread.run_sync(
                _poll, factory, job_id, last, limiter=polls
            )
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

    return SlotStreamingResponse(
        events(),
        slot=slot,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/{job_id}/metrics", response_model=MetricsPage, responses=_ERRORS)
def get_metrics(
    job: OwnedJob,
    session: SessionDep,
    from_step: Annotated[int, Query(ge=0, le=INT4_MAX)] = 0,
    to_step: Annotated[int | None, Query(ge=0, le=INT4_MAX)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
):
    """Per-step training metrics with from_step <= step <= to_step, by step. For the next
    page, ask again with from_step = the last step + 1."""
    if to_step is not None and to_step < from_step:
        raise api_error(422, "to_step must not be below from_step", field="to_step")
    rows = job_states.metrics_between(session, job.id, from_step, to_step, limit + 1)
    return MetricsPage(data=[MetricOut.of(r) for r in rows[:limit]], has_more=len(rows) > limit)


@router.get("/{job_id}/checkpoints", response_model=Page[CheckpointOut], responses=_ERRORS)
def list_checkpoints(job: OwnedJob, session: SessionDep):
    """Every saved checkpoint, by step."""
    rows = job_states.checkpoints(session, job.id)
    return page_of(rows, len(rows), CheckpointOut, "step")


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
    step: Annotated[int, Path(ge=0, le=INT4_MAX)],
    file: Annotated[
        str, Query(min_length=1, max_length=255, description="A name from the checkpoint's files.")
    ],
):
    """One file of a checkpoint: a redirect to a presigned URL on S3, streamed otherwise.
    Only names that exist under the checkpoint's prefix are served (no path tricks)."""
    ckpt = job_states.checkpoint_at(session, job.id, step)
    if ckpt is None:
        raise api_error(404, f"job {job.id} has no checkpoint at step {step}", field="step")
    return serve_file(store, settings, ckpt.object_prefix, file, f"checkpoint step {step}")


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
    final = job_states.exported_model(job)
    if final is None:
        raise api_error(
            404, f"job {job.id} has no exported model (status {job.status})", field="job_id"
        )
    return serve_file(store, settings, final["prefix"], file, "the exported model")
