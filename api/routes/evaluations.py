"""/v1/evaluations: create (queued, then handed to the workers), list, get, and the stored
per-evaluation report (JSON with per-item records, or its HTML page)."""

from __future__ import annotations

import importlib
import logging
from typing import Annotated, Any, Literal, Protocol

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.deps import (
    CeleryQueue,
    CurrentTeam,
    IdempotencyDep,
    SessionDep,
    SettingsDep,
    StoreDep,
    request_hash,
)
from api.errors import api_error
from api.schemas import ErrorResponse, Page
from api.schemas_eval import EVAL_FORMATS, EvalRequest, EvalKind, EvalStatus, EvaluationCreate, EvaluationOut
from models.settings import Settings, setting
from models.tables import Checkpoint, Evaluation, File, Job
from storage import ObjectNotFound

log = logging.getLogger("humanline.api")
router = APIRouter(prefix="/evaluations", tags=["evaluations"])
_ERRORS = {r: {"model": ErrorResponse} for r in (400, 401, 404, 409, 422, 429)}
RUN_EVALUATION_TASK = "worker.tasks.run_evaluation"
ACTIVE = ("queued", "running")
# Served report pages are inert documents: no scripts, no network.
REPORT_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:",
    "X-Content-Type-Options": "nosniff",
}


# --- settings (proposed fields of models.settings.Settings; env vars until then) -------------


def allowed_judge_urls(settings: Settings) -> set[str]:
    raw = str(setting(settings, "EVAL_JUDGE_BASE_URLS", ""))
    return {u.strip().rstrip("/") for u in raw.split(",") if u.strip()}


def reward_model_names(settings: Settings) -> set[str]:
    raw = str(setting(settings, "EVAL_REWARD_MODELS", ""))
    return {
        e.partition("=")[0].strip()
        for e in raw.split(",")
        if "=" in e and e.partition("=")[0].strip()
    }


# --- the queue -------------------------------------------------------------------------------


class EvaluationQueue(Protocol):
    def enqueue(self, evaluation_id: str) -> None: ...


class CeleryEvaluationQueue(CeleryQueue):
    """Sends `worker.tasks.run_evaluation(evaluation_id)` by name, like jobs' run_job."""

    def enqueue(self, evaluation_id: str) -> None:
        options = {"queue": self.queue} if self.queue else {}
        self._app().send_task(RUN_EVALUATION_TASK, args=[evaluation_id], **options)


class EmbeddedEvaluationQueue:
    """BROKER_URL=memory://: the in-process worker's `enqueue_evaluation`."""

    def enqueue(self, evaluation_id: str) -> None:
        embedded = importlib.import_module("worker.embedded")
        hand_over = getattr(embedded, "enqueue_evaluation", None)
        if hand_over is None:
            raise RuntimeError("the embedded worker cannot run evaluations (no enqueue_evaluation)")
        hand_over(evaluation_id)


def get_eval_queue(request: Request) -> EvaluationQueue:
    """app.state.eval_queue (tests set it), else one made from the settings on first use."""
    queue = getattr(request.app.state, "eval_queue", None)
    if queue is None:
        settings: Settings = request.app.state.settings
        queue = (
            EmbeddedEvaluationQueue()
            if settings.embedded_worker
            else CeleryEvaluationQueue(settings.BROKER_URL, settings.CELERY_QUEUE)
        )
        request.app.state.eval_queue = queue
    return queue


EvalQueueDep = Annotated[EvaluationQueue, Depends(get_eval_queue)]


def get_owned_evaluation(
    evaluation_id: Annotated[str, Path(max_length=64)], team: CurrentTeam, session: SessionDep
) -> Evaluation:
    row = session.get(Evaluation, evaluation_id)
    if row is None or row.team_id != team.id:
        raise api_error(404, f"no evaluation {evaluation_id!r}", field="evaluation_id")
    return row


OwnedEvaluation = Annotated[Evaluation, Depends(get_owned_evaluation)]


# --- create ----------------------------------------------------------------------------------


def _model(
    session: Session, team_id: str, body: EvaluationCreate, settings: Settings
) -> tuple[str | None, int | None]:
    """(job id, checkpoint row id) of what is evaluated; raises the API error otherwise."""
    if body.job_id is None:
        if body.base_model not in settings.allowed_base_models:
            raise api_error(
                422,
                f"unknown base_model {body.base_model!r}; one of {', '.join(settings.allowed_base_models)}",
                field="base_model",
            )
        return None, None
    job = session.get(Job, body.job_id)
    if job is None or job.team_id != team_id:
        raise api_error(404, f"no job {body.job_id!r}", field="job_id")
    if body.step is not None:
        ckpt = session.execute(
            select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.step == body.step)
        ).scalar_one_or_none()
        if ckpt is None:
            raise api_error(
                404, f"job {job.id} has no checkpoint at step {body.step}", field="step"
            )
        return job.id, ckpt.id
    if job.status != "succeeded" or not (job.result or {}).get("final_model"):
        raise api_error(
            409,
            f"job {job.id} is {job.status} and has no exported final model; "
            "evaluate a saved checkpoint with `step`, or wait for the job to succeed",
            field="job_id",
        )
    return job.id, None


def check_eval_file(session: Session, team_id: str, body: EvalRequest, where: str = "") -> File:
    """The team's processed eval file of the request's kind; `where` prefixes error fields."""
    row = session.get(File, body.file_id)
    if row is None or row.team_id != team_id:
        raise api_error(404, f"no file {body.file_id!r}", field=f"{where}file_id")
    if row.purpose != "eval":
        raise api_error(
            422,
            f"file {row.id} was uploaded with purpose {row.purpose!r}; evaluations need 'eval'",
            field=f"{where}file_id",
        )
    if row.status != "processed":
        raise api_error(422, f"file {row.id} is {row.status}, not processed", field=f"{where}file_id")
    want = EVAL_FORMATS[body.kind]
    if row.format != want:
        raise api_error(
            422,
            f"a {body.kind} evaluation needs a {want} file; file {row.id} is {row.format}",
            field=f"{where}file_id",
        )
    return row


def check_judge(body: EvalRequest, settings: Settings, where: str = "") -> dict[str, Any] | None:
    """The judge as stored, if the operator allows it; `where` prefixes error fields."""
    judge = body.judge
    if judge is None:
        return None
    if judge.type == "openai":
        url = judge.base_url.strip().rstrip("/")
        allowed = allowed_judge_urls(settings)
        if url not in allowed:
            # The server's API key goes to this URL: only operator-approved endpoints.
            raise api_error(
                422,
                f"judge endpoint {url!r} is not allowed"
                + (
                    f"; allowed: {', '.join(sorted(allowed))}"
                    if allowed
                    else "; the operator has allowed none (EVAL_JUDGE_BASE_URLS)"
                ),
                field=f"{where}judge.base_url",
            )
        return body.stored_judge()
    names = reward_model_names(settings)
    if judge.model not in names:
        raise api_error(
            422,
            f"unknown reward model {judge.model!r}"
            + (
                f"; one of {', '.join(sorted(names))}"
                if names
                else "; none is configured (EVAL_REWARD_MODELS)"
            ),
            field=f"{where}judge.model",
        )
    return body.stored_judge()


@router.post("", status_code=201, response_model=EvaluationOut, responses=_ERRORS)
def create_evaluation(
    body: EvaluationCreate,
    team: CurrentTeam,
    session: SessionDep,
    settings: SettingsDep,
    queue: EvalQueueDep,
    idem: IdempotencyDep,
):
    """Evaluate a job's final model, one of its checkpoints (`step`), or a base model, on an
    eval file. The evaluation is committed as `queued`, then handed to the workers; poll
    GET /v1/evaluations/{id} until it is `succeeded` or `failed`."""
    req_hash = request_hash(body.model_dump(mode="json", exclude_unset=True))
    if (replayed := idem.replay(req_hash)) is not None:
        return replayed
    if (problem := body.problem()) is not None:
        raise api_error(422, f"{problem[0]}: {problem[1]}", field=problem[0])
    job_id, checkpoint_id = _model(session, team.id, body, settings)
    file = check_eval_file(session, team.id, body)
    check_judge(body, settings)
    limit = int(setting(settings, "MAX_EVALS_PER_TEAM", 10))
    active = session.execute(
        select(func.count())
        .select_from(Evaluation)
        .where(Evaluation.team_id == team.id, Evaluation.status.in_(ACTIVE))
    ).scalar_one()
    if active >= limit:
        raise api_error(429, f"at most {limit} queued or running evaluations per team")
    config = body.stored_config(file, step=body.step)
    row = Evaluation(
        team_id=team.id,
        job_id=job_id,
        checkpoint_id=checkpoint_id,
        base_model=body.base_model if job_id is None else None,
        file_id=file.id,
        kind=body.kind,
        status="queued",
        config=config,
    )
    session.add(row)
    session.flush()
    out = EvaluationOut.of(row).model_dump(mode="json")
    if (winner := idem.commit(req_hash, 201, out)) is not None:
        return winner
    try:  # after the commit: the worker must find the row
        queue.enqueue(row.id)
    except Exception:
        log.exception(
            "could not enqueue evaluation; it stays queued", extra={"evaluation_id": row.id}
        )
    return JSONResponse(out, status_code=201)


# --- read ------------------------------------------------------------------------------------


@router.get("", response_model=Page[EvaluationOut], responses=_ERRORS)
def list_evaluations(
    team: CurrentTeam,
    session: SessionDep,
    job_id: Annotated[str | None, Query(max_length=64)] = None,
    status: EvalStatus | None = None,
    kind: EvalKind | None = None,
    after: Annotated[
        str | None, Query(max_length=64, description="Cursor: an evaluation id.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
):
    """Newest first; filter by job, status and kind."""
    query = select(Evaluation).where(Evaluation.team_id == team.id)
    if job_id is not None:
        query = query.where(Evaluation.job_id == job_id)
    if status is not None:
        query = query.where(Evaluation.status == status)
    if kind is not None:
        query = query.where(Evaluation.kind == kind)
    if after is not None:
        query = query.where(Evaluation.id < after)
    rows = list(session.execute(query.order_by(Evaluation.id.desc()).limit(limit + 1)).scalars())
    data = [EvaluationOut.of(r) for r in rows[:limit]]
    return Page[EvaluationOut](
        data=data,
        has_more=len(rows) > limit,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )


@router.get("/{evaluation_id}", response_model=EvaluationOut, responses=_ERRORS)
def get_evaluation(evaluation: OwnedEvaluation):
    return EvaluationOut.of(evaluation)


@router.get(
    "/{evaluation_id}/report",
    responses={200: {"content": {"application/json": {}, "text/html": {}}}, **_ERRORS},
)
def get_evaluation_report(
    evaluation: OwnedEvaluation,
    store: StoreDep,
    format: Literal["json", "html"] = "json",
):
    """The full result (every item's answers and verdicts) as JSON, or its HTML page."""
    keys = (evaluation.result or {}).get("report") or {}
    key = keys.get(format)
    if evaluation.status != "succeeded" or not key:
        raise api_error(
            409,
            f"evaluation {evaluation.id} is {evaluation.status}; its report exists once it succeeded",
            field="evaluation_id",
        )
    try:
        store.size(key)
    except ObjectNotFound:
        raise api_error(
            404, f"the report of evaluation {evaluation.id} is missing from the store"
        ) from None
    media = "application/json" if format == "json" else "text/html; charset=utf-8"
    return StreamingResponse(store.get_stream(key), media_type=media, headers=REPORT_HEADERS)
