"""Evaluations named in a job spec: created with the `succeeded` transition, then sent."""

from __future__ import annotations

from sqlalchemy import select

from contract.spec import JobSpec
from models import jobs as job_states
from models.tables import Evaluation, File, JobEvent
from worker.job_evaluations import create_job_evaluations


def _file(s, team_id: str, fmt: str, purpose: str) -> File:
    row = File(
        team_id=team_id,
        filename="f.jsonl",
        purpose=purpose,
        bytes=10,
        sha256="ab" * 32,
        format=fmt,
        records=3,
        status="processed",
        object_key=f"{team_id}/files/x",
    )
    s.add(row)
    s.flush()
    return row


def test_a_succeeded_job_queues_its_evaluations(local):
    with local.sessions() as s:
        train = _file(s, local.team_id, "preference", "train")
        math = _file(s, local.team_id, "eval_math", "eval")
        spec = JobSpec.model_validate(
            {
                "base_model": "tiny-llama",
                "training_file": train.id,
                "objective": "dpo",
                "evaluations": [
                    {"file_id": math.id, "kind": "math", "generation": {"n": 2}},
                    {"file_id": "file-gone", "kind": "math"},
                ],
            }
        )
        job = job_states.create_job(s, team_id=local.team_id, spec=spec.model_dump(mode="json"))
        assert job_states.claim(s, job.id, "w1", 60) is not None
        assert job_states.finish(s, job.id, "w1", "succeeded")
        ids = create_job_evaluations(s, job.id)
        s.commit()
        rows = s.execute(select(Evaluation)).scalars().all()
        assert [r.id for r in rows] == ids and len(ids) == 1
        row = rows[0]
        assert (row.status, row.kind, row.job_id, row.file_id) == (
            "queued",
            "math",
            job.id,
            math.id,
        )
        assert row.config["generation"]["n"] == 2 and row.config["file"]["format"] == "eval_math"
        kinds = [
            e.kind for e in s.execute(select(JobEvent).where(JobEvent.job_id == job.id)).scalars()
        ]
        assert "warning" in kinds and "evaluations" in kinds  # the missing file is said, not lost


def test_evaluations_named_in_a_spec_respect_the_teams_quota(local):
    """Issue 14 #7: evaluations named in a job spec skipped MAX_EVALS_PER_TEAM. With 2 of a
    limit of 3 already active, a job naming 3 queues one and says why the others were not."""
    with local.sessions() as s:
        train = _file(s, local.team_id, "preference", "train")
        math = _file(s, local.team_id, "eval_math", "eval")
        for _ in range(2):
            s.add(Evaluation(team_id=local.team_id, file_id=math.id, kind="math", status="queued",
                             config={}))  # fmt: skip
        spec = JobSpec.model_validate(
            {
                "base_model": "tiny-llama",
                "training_file": train.id,
                "objective": "dpo",
                "evaluations": [{"file_id": math.id, "kind": "math"}] * 3,
            }
        )
        job = job_states.create_job(s, team_id=local.team_id, spec=spec.model_dump(mode="json"))
        assert job_states.claim(s, job.id, "w1", 60) is not None
        assert job_states.finish(s, job.id, "w1", "succeeded")
        ids = create_job_evaluations(s, job.id, limit=3)
        s.commit()
        assert len(ids) == 1
        active = s.execute(select(Evaluation).where(Evaluation.status == "queued")).scalars().all()
        assert len(active) == 3
        warnings = [
            e.message
            for e in s.execute(
                select(JobEvent).where(JobEvent.job_id == job.id, JobEvent.kind == "warning")
            ).scalars()
        ]
        assert len(warnings) == 2 and all("not queued" in w for w in warnings)
