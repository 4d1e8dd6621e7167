"""Evaluations a job spec names, created when the job succeeds (in the same transaction as the
`succeeded` transition, so none is lost) and sent after the commit."""

from __future__ import annotations

from sqlalchemy.orm import Session

from models import jobs as job_states
from models.tables import Evaluation, File, Job
from trainer.spec.job import JobSpec


def create_job_evaluations(session: Session, job_id: str) -> list[str]:
    """Queued evaluation rows of the job's final model, one per `spec.evaluations` entry.
    An eval file deleted since the job was submitted is skipped with an event."""
    job = session.get(Job, job_id)
    if job is None:
        return []
    ids = []
    for i, request in enumerate(JobSpec.model_validate(job.spec).evaluations):
        file = session.get(File, request.file_id)
        if file is None or file.team_id != job.team_id:
            job_states.add_event(session, job_id, "warning", f"evaluation {i}: eval file {request.file_id} is gone", {})
            continue
        row = Evaluation(team_id=job.team_id, job_id=job.id, checkpoint_id=None, base_model=None,
                         file_id=file.id, kind=request.kind, status="queued", config=request.stored_config(file))
        session.add(row)
        session.flush()
        ids.append(row.id)
    if ids:
        job_states.add_event(session, job_id, "evaluations", f"{len(ids)} evaluation(s) queued", {"ids": ids})
    return ids
