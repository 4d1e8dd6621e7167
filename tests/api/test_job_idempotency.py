"""Idempotency-Key on /v1/jobs: a retry replays the original (create and cancel), keys are per
path, a malformed key is 400, and concurrent retries with one key create one job."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from models import jobs as job_states
from tests.api.conftest import (
    create_job,
    job_body,
    job_rows,
)


def test_idempotent_create_returns_the_original_job(client, team_a, train_file, queue, db_sessions):
    key = {**team_a.headers, "Idempotency-Key": "create-1"}
    first = client.post("/v1/jobs", headers=key, json=job_body(train_file))
    again = client.post("/v1/jobs", headers=key, json=job_body(train_file))
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert again.headers.get("idempotent-replayed") == "true"
    assert job_rows(db_sessions) == 1 and queue.job_ids == [first.json()["id"]]
    different = client.post("/v1/jobs", headers=key, json=job_body(train_file, seed=7))
    assert different.status_code == 409
    assert different.json()["error"]["field"] == "Idempotency-Key"
    # the same key on another team is another key
    assert job_rows(db_sessions) == 1


def test_idempotency_key_is_per_path(client, team_a, train_file):
    job = client.post(
        "/v1/jobs", headers={**team_a.headers, "Idempotency-Key": "k"}, json=job_body(train_file)
    ).json()
    r = client.post(
        f"/v1/jobs/{job['id']}/cancel", headers={**team_a.headers, "Idempotency-Key": "k"}
    )
    assert r.status_code == 409


def test_bad_idempotency_key_is_400(client, team_a, train_file):
    r = client.post(
        "/v1/jobs",
        headers={**team_a.headers, "Idempotency-Key": "x" * 300},
        json=job_body(train_file),
    )
    assert r.status_code == 400 and r.json()["error"]["field"] == "Idempotency-Key"


def test_concurrent_retries_with_one_key_create_one_job(
    client, team_a, train_file, queue, db_sessions
):
    headers = {**team_a.headers, "Idempotency-Key": "race"}

    def post(_):
        return client.post("/v1/jobs", headers=headers, json=job_body(train_file))

    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(post, range(6)))
    statuses = sorted(r.status_code for r in responses)
    ok = [r for r in responses if r.status_code == 201]
    assert ok, statuses
    assert {r.json()["id"] for r in ok} == {ok[0].json()["id"]}
    # a request still racing the winner may see 409 "in progress" but never a second job
    assert set(statuses) <= {201, 409}
    assert job_rows(db_sessions) == 1 and len(queue.job_ids) == 1


def test_idempotency_loses_the_race_gracefully(
    client, team_a, train_file, db_sessions, monkeypatch
):
    """Between our lookup and our commit another request with the key commits first."""
    from api import deps

    original = deps.Idempotency._stored
    calls = {"n": 0}

    def stored(self):
        calls["n"] += 1
        if calls["n"] == 1:  # our first lookup finds nothing; a rival then wins
            with db_sessions() as s:
                job = job_states.create_job(s, team_id=team_a.id, spec={"objective": {}})
                s.add(
                    deps.IdempotencyKey(
                        team_id=team_a.id,
                        key="raced",
                        method_path="POST /v1/jobs",
                        request_hash=self.request_hash,
                        response_status=201,
                        response_body={"id": job.id, "winner": True},
                    )
                )
                s.commit()
            return None
        return original(self)

    monkeypatch.setattr(deps.Idempotency, "_stored", stored)
    r = client.post(
        "/v1/jobs",
        headers={**team_a.headers, "Idempotency-Key": "raced"},
        json=job_body(train_file),
    )
    assert r.status_code == 201 and r.json()["winner"] is True
    assert job_rows(db_sessions) == 1  # ours was rolled back


def test_idempotent_cancel_replays(client, team_a, train_file):
    job_id = create_job(client, team_a, train_file)["id"]
    headers = {**team_a.headers, "Idempotency-Key": "cancel-1"}
    first = client.post(f"/v1/jobs/{job_id}/cancel", headers=headers)
    again = client.post(f"/v1/jobs/{job_id}/cancel", headers=headers)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()


def test_a_request_is_compared_by_what_the_client_sent(client, team_a, train_file):
    """Key order does not make another request; an explicitly sent default does."""
    key = {**team_a.headers, "Idempotency-Key": "canon-1"}
    body = job_body(train_file)
    first = client.post("/v1/jobs", headers=key, json=body)
    reordered = client.post("/v1/jobs", headers=key, json=dict(reversed(list(body.items()))))
    assert first.status_code == reordered.status_code == 201
    assert reordered.json()["id"] == first.json()["id"]
    assert reordered.headers.get("idempotent-replayed") == "true"
    explicit_default = client.post("/v1/jobs", headers=key, json={**body, "epochs": 1})
    assert explicit_default.status_code == 409


def test_idempotency_without_a_key_hashes_and_stores_nothing(db_sessions, team_a):
    from api.deps import Idempotency
    from models.tables import IdempotencyKey

    with db_sessions() as session:
        idem = Idempotency(session, team_a.id, None, "POST /v1/jobs")
        assert idem.replay({"any": "request"}) is None and idem.request_hash is None
        assert idem.commit(201, {"id": "x"}) is None
        assert session.query(IdempotencyKey).count() == 0
        keyed = Idempotency(session, team_a.id, "k-1", "POST /v1/jobs")
        with pytest.raises(RuntimeError, match="before replay"):
            keyed.commit(201, {"id": "x"})  # a route that never asked replay() is a bug
