"""/v1/evaluations: create (queued, then handed to the workers), list, get, and the stored
per-evaluation report (JSON with per-item records, or its HTML page)."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response, StreamingResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.admission import check_base_model, check_eval_file, check_judge
from api.deps import (
    CurrentTeam,
    IdempotencyDep,
    SessionDep,
    SettingsDep,
    StoreDep,
)
from api.errors import api_error
from api.owned import OwnedEvaluation, get_owned_evaluation, owned  # noqa: F401 (re-exported)
from api.paging import DEFAULT_LIMIT, Cursor, Limit, fetch_page, where_given
from api.queues import EvalQueueDep, enqueue_after_commit
from api.schemas import Page, error_responses
from api.schemas_eval import (
    EvalKind,
    EvalStatus,
    EvaluationCreate,
    EvaluationOut,
)
from models import jobs as job_states
from models.quota import within_eval_quota
from models.settings import Settings
from models.tables import Evaluation, Job
from storage import ObjectNotFound

log = logging.getLogger("humanline.api")
router = APIRouter(prefix="/evaluations", tags=["evaluations"])
_ERRORS = error_responses(400, 401, 404, 409, 422, 429)
# Served report pages are inert documents: no scripts, no network.
REPORT_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:",
    "X-Content-Type-Options": "nosniff",
}


# --- create ----------------------------------------------------------------------------------


def _model(
    session: Session, team_id: str, body: EvaluationCreate, settings: Settings
) -> tuple[str | None, int | None]:
    """(job id, checkpoint row id) of what is evaluated; raises the API error otherwise."""
    if body.job_id is None:
        check_base_model(body.base_model, settings)
        return None, None
    job = owned(session, Job, body.job_id, team_id, field="job_id")
    if body.step is not None:
        ckpt = job_states.checkpoint_at(session, job.id, body.step)
        if ckpt is None:
            raise api_error(
                404, f"job {job.id} has no checkpoint at step {body.step}", field="step"
            )
        return job.id, ckpt.id
    if job_states.exported_model(job) is None:
        raise api_error(
            409,
            f"job {job.id} is {job.status} and has no exported final model; "
            "evaluate a saved checkpoint with `step`, or wait for the job to succeed",
            field="job_id",
        )
    return job.id, None


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
    if (replayed := idem.replay(body)) is not None:
        return replayed
    if (problem := body.problem()) is not None:
        raise api_error(422, f"{problem[0]}: {problem[1]}", field=problem[0])
    job_id, checkpoint_id = _model(session, team.id, body, settings)
    file = check_eval_file(session, team.id, body)
    check_judge(body, settings)
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
    limit = settings.MAX_EVALS_PER_TEAM  # after the insert, counted under the team's lock
    if not within_eval_quota(session, team.id, limit):
        session.rollback()
        raise api_error(
            429, f"at most {limit} queued or running evaluations per team",
            headers={"x-should-retry": "false"},
        )
    out = EvaluationOut.of(row).model_dump(mode="json")
    if (winner := idem.commit(201, out)) is not None:
        return winner
    enqueue_after_commit(queue, row.id)  # after the commit: the worker must find the row
    return JSONResponse(out, status_code=201)


# --- read ------------------------------------------------------------------------------------


@router.get("", response_model=Page[EvaluationOut], responses=_ERRORS)
def list_evaluations(
    team: CurrentTeam,
    session: SessionDep,
    job_id: Annotated[str | None, Query(max_length=64)] = None,
    status: EvalStatus | None = None,
    kind: EvalKind | None = None,
    after: Cursor = None,
    limit: Limit = DEFAULT_LIMIT,
):
    """Newest first; filter by job, status and kind."""
    query = where_given(
        select(Evaluation).where(Evaluation.team_id == team.id),
        (Evaluation.job_id, job_id),
        (Evaluation.status, status),
        (Evaluation.kind, kind),
    )
    return fetch_page(session, query, Evaluation.id, after, limit, EvaluationOut)


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
            f"evaluation {evaluation.id} is {evaluation.status}; "
            "its report exists once it succeeded",
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


@router.get(
    "/{evaluation_id}/export",
    responses={200: {"content": {"application/json": {}, "text/csv": {}}}, **_ERRORS},
)
def export_evaluation(
    evaluation: OwnedEvaluation,
    store: StoreDep,
    format: Literal["alpaca_eval", "lighteval"],
    part: Literal["all", "model_outputs", "leaderboard"] = "all",
    name: Annotated[str | None, Query(max_length=128, pattern=r"^[\w.@/+-]+$")] = None,
    task: Annotated[str, Query(max_length=64, pattern=r"^[a-z0-9_]+$")] = "math_500",
):
    """The evaluation in the field's formats, with its judge, baseline, decoding parameters
    and truncated-answer count (`provenance`). `alpaca_eval` (instruction evaluations):
    `model_outputs` (AlpacaEval's model_outputs.json), `leaderboard` (its leaderboard.csv
    row) or `all` (both, JSON). `lighteval` (math): lighteval's results file, the metrics
    under `results["humanline|{task}|0"]`. `name`: the generator (default: job[@step-N])."""
    from reports import exports

    keys = (evaluation.result or {}).get("report") or {}
    if evaluation.status != "succeeded" or not keys.get("json"):
        raise api_error(
            409,
            f"evaluation {evaluation.id} is {evaluation.status}; it can be exported once it "
            "succeeded",
            field="evaluation_id",
        )
    try:
        doc = json.loads(store.get_bytes(keys["json"]))
    except ObjectNotFound:
        raise api_error(
            404, f"the report of evaluation {evaluation.id} is missing from the store"
        ) from None
    try:
        out = exports.export(doc, format, name, task)
    except ValueError as e:
        raise api_error(409, str(e), field="format") from None
    if format == "alpaca_eval" and part == "model_outputs":
        return JSONResponse(out["model_outputs"], headers=REPORT_HEADERS)
    if format == "alpaca_eval" and part == "leaderboard":
        ((gen, row),) = out["leaderboard"].items()
        text = exports.leaderboard_csv(row, gen)
        return Response(text, media_type="text/csv; charset=utf-8", headers=REPORT_HEADERS)
    return JSONResponse(out, headers=REPORT_HEADERS)
