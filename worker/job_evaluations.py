"""Evaluations a job spec names, created when the job succeeds (in the same transaction as the
`succeeded` transition, so none is lost) and sent after the commit."""

from __future__ import annotations

from sqlalchemy.orm import Session

from contract.spec import JobSpec
from models import jobs as job_states
from models.quota import within_eval_quota
from models.tables import Evaluation, File, Job


def create_job_evaluations(session: Session, job_id: str, limit: int | None = None) -> list[str]:
    """Queued evaluation rows of the job's final model, one per `spec.evaluations` entry.
    An eval file deleted since the job was submitted is skipped with an event, and so is an
    evaluation that would take the team past `limit` (MAX_EVALS_PER_TEAM, checked as the API
    checks it: models.quota.within_eval_quota); the job still succeeds."""
    job = session.get(Job, job_id)
    if job is None:
        return []
    ids = []
    for i, request in enumerate(JobSpec.model_validate(job.spec).evaluations):
        file = session.get(File, request.file_id)
        if file is None or file.team_id != job.team_id:
            gone = f"evaluation {i}: eval file {request.file_id} is gone"
            job_states.add_event(session, job_id, "warning", gone, {})
            continue
        config = request.stored_config(file)  # of the job's final model: no checkpoint, no base
        row = Evaluation(team_id=job.team_id, job_id=job.id, file_id=file.id, kind=request.kind,
                         status="queued", config=config)  # fmt: skip
        session.add(row)
        session.flush()
        if limit is not None and not within_eval_quota(session, job.team_id, limit):
            session.delete(row)
            session.flush()
            over = (f"evaluation {i} not queued: the team has {limit} queued or running "
                    "evaluations (its limit); create it with POST /v1/evaluations later")
            job_states.add_event(session, job_id, "warning", over, {"field": f"evaluations.{i}"})
            continue
        ids.append(row.id)
    if ids:
        queued = f"{len(ids)} evaluation(s) queued"
        job_states.add_event(session, job_id, "evaluations", queued, {"ids": ids})
    return ids
