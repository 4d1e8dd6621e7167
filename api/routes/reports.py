"""Reports rendered on request from the DB: a job's report and a comparison across jobs.

Rendered here (not by the worker) so a report is current: a running job's curves, and every
evaluation as it lands. reports is torch-free (numpy + matplotlib, imported on first
use); a page with a dozen inline SVG plots takes well under a second to draw.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse, JSONResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.deps import CurrentTeam, SessionDep
from api.errors import api_error
from api.owned import OwnedJob
from api.routes.evaluations import REPORT_HEADERS
from api.schemas import JobOut, error_responses
from api.schemas_eval import eval_summary
from models.tables import Evaluation, File, Job, JobEvent, JobMetric

router = APIRouter(tags=["reports"])
_ERRORS = error_responses(400, 401, 404, 422)
MAX_COMPARE = 50
MAX_METRIC_ROWS = 100_000


def _evaluations(
    session: Session, team_id: str, job_ids: list[str]
) -> dict[str, list[dict[str, Any]]]:
    rows = session.execute(
        select(Evaluation)
        .where(Evaluation.team_id == team_id, Evaluation.job_id.in_(job_ids))
        .order_by(Evaluation.id)
    ).scalars()
    out: dict[str, list[dict[str, Any]]] = {j: [] for j in job_ids}
    for r in rows:
        out[r.job_id].append(eval_summary(r))  # type: ignore[index]
    return out


def _job_dict(job: Job) -> dict[str, Any]:
    out = JobOut.of(job).model_dump(mode="json")
    out.pop("spec", None)
    return out


def _data_quality(session: Session, job: Job) -> dict[str, Any] | None:
    """The histogram travels in the `data_quality` event (job.result keeps a summary)."""
    event = session.execute(
        select(JobEvent)
        .where(JobEvent.job_id == job.id, JobEvent.kind == "data_quality")
        .order_by(JobEvent.seq.desc())
        .limit(1)
    ).scalar_one_or_none()
    if event is not None and event.data:
        return {k: v for k, v in event.data.items() if k != "attempt"}
    return (job.result or {}).get("data_quality")


def _metrics(session: Session, job_id: str) -> list[dict[str, Any]]:
    return [
        {"step": m.step, **m.values}
        for m in session.execute(
            select(JobMetric)
            .where(JobMetric.job_id == job_id)
            .order_by(JobMetric.step)
            .limit(MAX_METRIC_ROWS)
        ).scalars()
    ]


def _started(session: Session, job_id: str) -> dict[str, Any]:
    """The newest `started` event's data (world size, device): GPU-hours in a comparison."""
    event = session.execute(
        select(JobEvent)
        .where(JobEvent.job_id == job_id, JobEvent.kind == "started")
        .order_by(JobEvent.seq.desc())
        .limit(1)
    ).scalar_one_or_none()
    return dict(event.data or {}) if event is not None else {}


def _render(doc: dict[str, Any], fmt: str, render) -> Any:
    if fmt == "json":
        return JSONResponse(doc)
    return HTMLResponse(render(doc), headers=REPORT_HEADERS)


@router.get(
    "/jobs/{job_id}/report",
    responses={200: {"content": {"application/json": {}, "text/html": {}}}, **_ERRORS},
)
def job_report(
    job: OwnedJob,
    team: CurrentTeam,
    session: SessionDep,
    format: Literal["json", "html"] = "json",
):
    """The job's report: training curves (loss, rewards, margins, clamp fraction, KL, grad
    norm, lr), the data-quality histogram, its evaluations, and the manifest (spec, training
    data sha256, code version, seed, wall-clock per phase)."""
    from reports import build_job_report, render_job_html

    metrics = _metrics(session, job.id)
    events = [
        {"kind": e.kind, "message": e.message, "data": e.data, "time": e.created_at}
        for e in session.execute(
            select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.seq)
        ).scalars()
    ]
    tf = session.get(File, job.training_file_id) if job.training_file_id else None
    training_file = (
        {
            "id": tf.id,
            "filename": tf.filename,
            "sha256": tf.sha256,
            "format": tf.format,
            "records": tf.records,
            "bytes": tf.bytes,
        }
        if tf is not None and tf.team_id == team.id
        else None
    )
    doc = build_job_report(
        job={
            **_job_dict(job),
            "created_at": job.created_at,
            "finished_at": job.finished_at,
            "started_at": job.started_at,
        },
        spec=job.spec,
        metrics=metrics,
        events=events,
        data_quality=_data_quality(session, job),
        evaluations=_evaluations(session, team.id, [job.id])[job.id],
        training_file=training_file,
    )
    return _render(doc, format, render_job_html)


@router.get(
    "/reports/compare",
    responses={200: {"content": {"application/json": {}, "text/html": {}}}, **_ERRORS},
)
def compare_jobs(
    team: CurrentTeam,
    session: SessionDep,
    jobs: Annotated[
        str, Query(min_length=1, max_length=4000, description="Comma-separated job ids.")
    ],
    format: Literal["json", "html"] = "html",
    metric: Annotated[
        str, Query(max_length=40, description="lc_win_rate, win_rate, pass_at_1, ...")
    ] = "lc_win_rate",
    file_id: Annotated[
        str | None, Query(max_length=64, description="Only evaluations on this file.")
    ] = None,
    group_by: Annotated[
        str | None,
        Query(
            max_length=64,
            pattern=r"^[A-Za-z0-9_.-]+$",
            description="A metadata key (e.g. arm): per group, `metric` at each evaluated "
            "checkpoint as mean ± SE over its jobs, against steps and against completions "
            "sampled.",
        ),
    ] = None,
):
    """The paper's Figure 1 across jobs: one group of bars per objective, one bar per variant
    (offline, offline+humanline, online, online+humanline) of each job's newest succeeded
    evaluation reporting `metric` (± 1 SE), with z-tests of offline+humanline vs offline and
    online vs offline+humanline (Holm-Bonferroni)."""
    from reports import METRICS, build_comparison, render_comparison_html

    if metric not in METRICS:
        raise api_error(
            422, f"unknown metric {metric!r}; one of {', '.join(METRICS)}", field="metric"
        )
    ids = list(dict.fromkeys(j.strip() for j in jobs.split(",") if j.strip()))
    if not ids:
        raise api_error(422, "name at least one job", field="jobs")
    if len(ids) > MAX_COMPARE:
        raise api_error(422, f"at most {MAX_COMPARE} jobs", field="jobs")
    rows = {
        j.id: j
        for j in session.execute(
            select(Job).where(Job.id.in_(ids), Job.team_id == team.id)
        ).scalars()
    }
    missing = [i for i in ids if i not in rows]
    if missing:
        raise api_error(404, f"no job {missing[0]!r}", field="jobs")
    evals = _evaluations(session, team.id, ids)
    entries = [
        {
            "job": _job_dict(rows[i]),
            "evaluations": evals[i],
            "spec": rows[i].spec,
            "metrics": _metrics(session, i),
            "started": _started(session, i),
        }
        for i in ids
    ]
    if group_by and not any(group_by in (rows[i].meta or {}) for i in ids):
        raise api_error(422, f"no job has the metadata key {group_by!r}", field="group_by")
    doc = build_comparison(entries, metric=metric, file_id=file_id, group_by=group_by)
    return _render(doc, format, render_comparison_html)
