"""/v1/fine_tuning/jobs and /v1/models: OpenAI's fine-tuning surface over our jobs.

Point the `openai` package at `{server}/v1` with a team key and `client.fine_tuning.jobs.*`
and `client.models.*` work. The rows, validation, admission and workers are those of
/v1/jobs; `api.openai_compat` maps the shapes both ways. Errors keep our shape, which is
OpenAI's (`{"error": {"message", "type", "param", "code"}}`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy import select

from api import openai_compat as oa
from api.admission import admit_job
from api.deps import CurrentTeam, IdempotencyDep, SessionDep, SettingsDep
from api.errors import api_error, validation_errors
from api.owned import owned
from api.paging import DEFAULT_LIMIT, Cursor, Limit, newest_first
from api.queues import QueueDep, enqueue_after_commit
from api.routes.jobs import cancel_with
from api.schemas import error_responses, unix_seconds
from contract.spec import JobSpec
from models.jobs import exported_model, exported_models
from models.tables import Checkpoint, File, Job, JobEvent, JobMetric

router = APIRouter(tags=["openai"])
_ERRORS = error_responses(400, 401, 404, 409, 422, 429)
BASE_MODELS_CREATED = 1767225600  # 2026-01-01: base models carry no creation time of ours


def _page(rows: list[Any], limit: int, to_object: Callable[[Any], dict]) -> dict[str, Any]:
    """OpenAI's list object of `rows`, fetched with limit + 1 (one more: has_more)."""
    data = [to_object(r) for r in rows[:limit]]
    return {"object": "list", "data": data, "has_more": len(rows) > limit}


def _owned_job(
    job_id: Annotated[str, Path(max_length=64)], team: CurrentTeam, session: SessionDep
) -> Job:
    return owned(session, Job, job_id, team.id, field="fine_tuning_job_id")


OwnedJob = Annotated[Job, Depends(_owned_job)]


class JobRows:
    """A dependency: the team's job and a page of its numbered rows (events by seq,
    checkpoints by step), newest first, before the cursor `after`: an OpenAI id ending in our
    number (ftevent-{job}-{seq}, ftckpt-{job}-{step})."""

    def __init__(
        self,
        job: OwnedJob,
        session: SessionDep,
        after: Annotated[str | None, Query(max_length=128)] = None,
    ):
        self.job, self.session, self.after = job, session, after

    def newest(self, table: Any, number: Any, limit: int, noun: str) -> list[Any]:
        """limit + 1 of the job's rows of `table`, highest `number` first, before `after`."""
        query = select(table).where(table.job_id == self.job.id)
        if self.after is not None:
            seq = oa.event_seq(self.after)
            if seq is None:
                raise api_error(400, f"not a {noun} id: {self.after!r}", field="after")
            query = query.where(number < seq)
        rows = self.session.execute(query.order_by(number.desc()).limit(limit + 1)).scalars()
        return list(rows)


def _records(session, team_id: str, body: oa.FineTuningJobCreate) -> int:
    row = session.get(File, body.training_file)
    return row.records if row is not None and row.team_id == team_id else 0


@router.post("/fine_tuning/jobs", responses=_ERRORS)
def create_fine_tuning_job(
    body: oa.FineTuningJobCreate,
    team: CurrentTeam,
    session: SessionDep,
    settings: SettingsDep,
    queue: QueueDep,
    idem: IdempotencyDep,
):
    """OpenAI's create: `method.type` supervised (the default), dpo or reinforcement; see
    api.openai_compat."""
    if (replayed := idem.replay(body)) is not None:
        return replayed
    try:
        spec = JobSpec.model_validate(oa.spec_of(body, _records(session, team.id, body)))
    except ValidationError as exc:
        errors = validation_errors(list(exc.errors()))
        first = errors[0]
        raise api_error(
            400, f"{first['field']}: {first['message']}", field=first["field"], errors=errors
        ) from None
    job = admit_job(spec, team.id, session, settings)
    out = oa.job_object(job)
    response = JSONResponse(out)  # rendered before the commit: nothing may fail after it
    if (winner := idem.commit(200, out)) is not None:
        return winner
    enqueue_after_commit(queue, job.id)
    return response


@router.get("/fine_tuning/jobs", responses=_ERRORS)
def list_fine_tuning_jobs(
    team: CurrentTeam,
    session: SessionDep,
    after: Cursor = None,
    limit: Limit = DEFAULT_LIMIT,
):
    """Newest first; `after` is the last job id of the previous page."""
    query = newest_first(select(Job).where(Job.team_id == team.id), Job.id, after, limit)
    return _page(list(session.execute(query).scalars()), limit, oa.job_object)


@router.get("/fine_tuning/jobs/{job_id}", responses=_ERRORS)
def retrieve_fine_tuning_job(job: OwnedJob):
    return oa.job_object(job)


@router.post("/fine_tuning/jobs/{job_id}/cancel", responses=_ERRORS)
def cancel_fine_tuning_job(job: OwnedJob, session: SessionDep, idem: IdempotencyDep):
    """A queued job is cancelled at once; a running one stops at its next step (OpenAI shows
    it `running` until then). A finished job is a 409."""
    return cancel_with(job, session, idem, oa.job_object, field="fine_tuning_job_id")


@router.get("/fine_tuning/jobs/{job_id}/events", responses=_ERRORS)
def list_fine_tuning_events(
    rows: Annotated[JobRows, Depends()], limit: Annotated[int, Query(ge=1, le=1000)] = 20
):
    """Newest first, as OpenAI lists them; `after` is the last event id of the previous page."""
    return _page(rows.newest(JobEvent, JobEvent.seq, limit, "event"), limit, oa.event_object)


@router.get("/fine_tuning/jobs/{job_id}/checkpoints", responses=_ERRORS)
def list_fine_tuning_checkpoints(
    page: Annotated[JobRows, Depends()], limit: Annotated[int, Query(ge=1, le=100)] = 10
):
    """Newest first, each with the training loss logged at its step."""
    job, session = page.job, page.session
    rows = page.newest(Checkpoint, Checkpoint.step, limit, "checkpoint")
    steps = [r.step for r in rows[:limit]]
    metrics: dict[int, dict[str, Any]] = {}
    if steps:
        found = session.execute(
            select(JobMetric).where(JobMetric.job_id == job.id, JobMetric.step.in_(steps))
        ).scalars()
        metrics = {m.step: m.values for m in found}
    return _page(rows, limit, lambda r: oa.checkpoint_object(job, r, metrics.get(r.step) or {}))


@router.get("/models", responses=_ERRORS)
def list_models(team: CurrentTeam, session: SessionDep, settings: SettingsDep):
    """The base models this server trains and the team's fine-tuned ones (`ft:` ids)."""
    data = [
        oa.model_object(m, BASE_MODELS_CREATED, "humanline") for m in settings.allowed_base_models
    ]
    data += [
        oa.model_object(
            oa.fine_tuned_model(j), unix_seconds(j.finished_at or j.created_at), team.id
        )
        for j in exported_models(session, team.id)
    ]
    return {"object": "list", "data": data}


@router.get("/models/{model_id:path}", responses=_ERRORS)
def retrieve_model(model_id: str, team: CurrentTeam, session: SessionDep, settings: SettingsDep):
    if model_id in settings.allowed_base_models:
        return oa.model_object(model_id, BASE_MODELS_CREATED, "humanline")
    job_id = oa.job_id_of_model(model_id)
    job = session.get(Job, job_id) if job_id else None
    if (
        job is None
        or job.team_id != team.id
        or exported_model(job) is None
        or (oa.fine_tuned_model(job) != model_id)
    ):  # not owned() alone: a model exists only once its job has exported one
        raise api_error(404, f"no model {model_id!r}", field="model")
    return oa.model_object(model_id, unix_seconds(job.finished_at or job.created_at), team.id)
