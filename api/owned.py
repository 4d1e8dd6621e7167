""""Owned by this team or 404": the one check every route that names a row makes. Another
team's row is indistinguishable from no row (DESIGN.md §6)."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from fastapi import Depends, Path
from sqlalchemy.orm import Session

from api.deps import CurrentTeam, SessionDep
from api.errors import api_error
from models.tables import Evaluation, File, Job

R = TypeVar("R")
_NOUNS: dict[type, str] = {Job: "job", File: "file", Evaluation: "evaluation"}


def owned(session: Session, model: type[R], row_id: str | None, team_id: str, *, field: str) -> R:
    """The team's `model` row `row_id`, or a 404 naming `field`."""
    row: Any = session.get(model, row_id) if row_id is not None else None
    if row is None or row.team_id != team_id:
        raise api_error(404, f"no {_NOUNS.get(model, 'row')} {row_id!r}", field=field)
    return row


def get_owned_job(
    job_id: Annotated[str, Path(max_length=64)], team: CurrentTeam, session: SessionDep
) -> Job:
    return owned(session, Job, job_id, team.id, field="job_id")


def get_owned_file(file_id: str, team: CurrentTeam, session: SessionDep) -> File:
    return owned(session, File, file_id, team.id, field="file_id")


def get_owned_evaluation(
    evaluation_id: Annotated[str, Path(max_length=64)], team: CurrentTeam, session: SessionDep
) -> Evaluation:
    return owned(session, Evaluation, evaluation_id, team.id, field="evaluation_id")


OwnedJob = Annotated[Job, Depends(get_owned_job)]
OwnedFile = Annotated[File, Depends(get_owned_file)]
OwnedEvaluation = Annotated[Evaluation, Depends(get_owned_evaluation)]
