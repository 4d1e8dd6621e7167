"""The job object's `training` (issue 25): the trainer's choice of micro-batch, from its
newest `started` event and any `out_of_memory` event after it."""

from __future__ import annotations

from models import jobs as job_states
from tests.api.conftest import create_job

STARTED = {
    "total_steps": 10, "grad_accum": 2, "micro_batch": 4, "activation_checkpointing": True,
    "compile": False, "memory_available_gib": 79.2, "memory_estimate_gib": 61.5, "attempt": 1,
}  # fmt: skip


def test_the_job_shows_the_trainers_choice_and_its_halvings(
    client, team_a, train_file, db_sessions
):
    job_id = create_job(client, team_a, train_file)["id"]

    def training():
        r = client.get(f"/v1/jobs/{job_id}", headers=team_a.headers)
        assert r.status_code == 200, r.text
        return r.json()["training"]

    def add(kind: str, data: dict) -> None:
        with db_sessions() as s:
            job_states.add_event(s, job_id, kind, kind, data)
            s.commit()

    assert training() is None  # the trainer has not started
    add("started", STARTED)
    add("log", {"grad_accum": 99})  # not a choice
    first = {k: v for k, v in STARTED.items() if k != "total_steps"}
    assert training() == first
    add("out_of_memory", {"grad_accum": 4, "micro_batch": 2, "step": 3, "attempt": 1})
    assert training() == {**first, "grad_accum": 4, "micro_batch": 2}
    add("started", {**STARTED, "grad_accum": 4, "micro_batch": 2, "attempt": 2})
    add("out_of_memory", {"grad_accum": 8, "micro_batch": 1, "attempt": 2})
    assert training() == {**first, "grad_accum": 8, "micro_batch": 1, "attempt": 2}
    # a list would need a query per job: it leaves the field null
    [listed] = client.get("/v1/jobs", headers=team_a.headers).json()["data"]
    assert listed["id"] == job_id and listed["training"] is None
