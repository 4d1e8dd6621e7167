"""/v1/jobs: creation, spec and training-file errors (each names its field), malformed and
oversized bodies, the active-job limit, batches larger than the data, and a broker that is down
(the job is still created). The rest of /v1/jobs: test_job_idempotency.py,
test_job_lifecycle.py (list, cancel, events, SSE, metrics), test_job_outputs.py (checkpoints,
the exported model, team isolation)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from models.tables import JobEvent
from tests.api.conftest import (
    EVAL_MATH,
    UNPAIRED,
    create_job,
    job_body,
    job_rows,
    upload,
)


def test_create_commits_a_queued_job_then_enqueues_it(client, team_a, train_file, queue):
    job = create_job(
        client,
        team_a,
        train_file,
        variant="offline+humanline",
        metadata={"experiment": "e1"},
        max_steps=3,
    )
    assert job["status"] == "queued" and job["object"] == "job"
    assert (job["objective"], job["variant"], job["training_file"]) == (
        "dpo",
        "offline+humanline",
        train_file,
    )
    assert job["metadata"] == {"experiment": "e1"}
    assert job["spec"]["humanline"] is True and job["spec"]["max_steps"] == 3
    assert queue.job_ids == [job["id"]]
    assert queue.seen_status[job["id"]] == "queued"  # the row was committed before enqueue
    events = client.get(f"/v1/jobs/{job['id']}/events", headers=team_a.headers).json()
    assert [e["kind"] for e in events["data"]] == ["created", "status"]
    assert events["data"][1]["data"] == {"from": "validating", "to": "queued"}
    assert client.get(f"/v1/jobs/{job['id']}", headers=team_a.headers).json() == job


def test_the_job_shows_resolved_values_never_null_for_a_default(client, team_a, db_sessions):
    """Issue 12: lr, batch size, steps, ε, schedule and preset as the run will use them. 40
    preference records: KTO splits them into 80 examples; GRPO's 64 sequences are 32 pairs."""
    rows = [{"prompt": f"Q{i}?", "chosen": "good", "rejected": "bad"} for i in range(40)]
    file_id = upload(client, team_a, "".join(json.dumps(r) + "\n" for r in rows).encode()).json()[
        "id"
    ]
    grpo = create_job(
        client,
        team_a,
        file_id,
        objective="grpo",
        variant="offline+humanline",
        epochs=2,
        batch_size=None,  # the default (job_body sets 4)
    )
    spec = grpo["spec"]
    assert (spec["optim"]["lr"], spec["batch_size"], spec["objective"]["epsilon"]) == (
        5e-6,
        64,
        0.15,
    )
    assert (spec["optim"]["schedule"], spec["preset"], spec["reference_sync"]) == (
        "constant_with_warmup",
        "instruction",
        "humanline",
    )
    assert grpo["total_steps"] == 2  # 40 groups // 32 per batch, × 2 epochs
    kto = create_job(client, team_a, file_id, objective="kto", batch_size=16)
    assert (kto["spec"]["optim"]["lr"], kto["spec"]["reference_sync"], kto["total_steps"]) == (
        5e-6,
        "none",
        5,
    )
    math = create_job(
        client, team_a, file_id, objective="grpo", preset="math", batch_size=16, optim={"lr": 2e-6}
    )
    assert (
        math["spec"]["optim"]["lr"],
        math["spec"]["optim"]["eps"],
        math["spec"]["objective"]["beta_kl"],
    ) == (2e-6, 1e-8, 1e-4)
    assert math["spec"]["objective"]["epsilon"] == 0.5  # offline, never synced
    assert client.get(f"/v1/jobs/{grpo['id']}", headers=team_a.headers).json()["spec"] == spec


def test_kto_accepts_unpaired_data(client, team_a):
    file_id = upload(client, team_a, UNPAIRED).json()["id"]
    assert create_job(client, team_a, file_id, objective={"name": "kto"})["objective"] == "kto"


@pytest.mark.parametrize(
    "overrides,status,field",
    [
        ({"objective": "ppo"}, 422, "objective"),
        ({"objective": {"name": "dpo", "beta": -1}}, 422, "objective.dpo.beta"),
        (
            {"humanline": True, "humanline_params": {"log_eps_P": 1.0, "log_eps_R": -1.0}},
            422,
            "humanline_params",
        ),
        ({"humanline_params": {"sync_every": 0}}, 422, "humanline_params.sync_every"),
        ({"learning_rate": 1e-5}, 422, "learning_rate"),
        ({"variant": "sideways"}, 422, None),
        ({"base_model": ""}, 422, "base_model"),
        ({"base_model": "/etc/models/llama"}, 422, "base_model"),
        ({"base_model": "../../somebody-else/checkpoint"}, 422, "base_model"),
        ({"training_file": "file-doesnotexist"}, 404, "training_file"),
        ({"metadata": {"bad key!": "x"}}, 422, "metadata.bad key!"),
        ({"metadata": {"k": "v" * 600}}, 422, "metadata.k"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, 422, "metadata"),
        ({"metadata": {"k": 3}}, 422, "metadata.k"),
        ({"objective": "grpo", "batch_size": 63}, 422, "batch_size"),  # sequences, groups of 2
        ({"preset": "chemistry"}, 422, "preset"),
        # SFT has no reference model and no sampled data (contract.sft_spec)
        ({"objective": "sft", "variant": "offline+humanline"}, 422, "variant"),
        ({"objective": "sft", "variant": "online", "max_steps": 4}, 422, "online"),
        # non-finite floats (JSON Infinity/NaN) and booleans for integers (issue 37)
        ({"optim": {"weight_decay": float("inf")}}, 422, "optim.weight_decay"),
        ({"optim": {"max_grad_norm": float("nan")}}, 422, "optim.max_grad_norm"),
        ({"adapter": {"alpha": float("-inf")}}, 422, "adapter.alpha"),
        (
            {
                "objective": "grpo",
                "variant": "online",
                "max_steps": 4,
                "online": {"temperature": float("inf")},
            },
            422,
            "online.temperature",
        ),  # fmt: skip
        (
            {
                "objective": "grpo",
                "variant": "online",
                "max_steps": 4,
                "online": {"rewards": [{"name": "format", "weight": float("nan")}]},
            },
            422,
            "online.rewards.0.weight",
        ),  # fmt: skip
        ({"parallelism": {"nodes": True}}, 422, "parallelism.nodes"),
        ({"max_steps": True}, 422, "max_steps"),
        ({"parallelism": {"hsdp": True}}, 422, "parallelism.hsdp"),
    ],
)
def test_bad_specs_are_rejected_with_the_field(
    client, team_a, train_file, queue, db_sessions, overrides, status, field
):
    body = json.dumps(job_body(train_file, **overrides))  # Infinity and NaN as Python writes them
    headers = {**team_a.headers, "content-type": "application/json"}
    r = client.post("/v1/jobs", headers=headers, content=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["request_id"]
    assert err.get("field") == field
    assert job_rows(db_sessions) == 0 and queue.job_ids == []


def test_training_file_must_be_the_teams_train_file_of_a_matching_format(
    client, team_a, team_b, train_file, db_sessions
):
    other = upload(client, team_b).json()["id"]
    r = client.post("/v1/jobs", headers=team_a.headers, json=job_body(other))
    assert r.status_code == 404 and r.json()["error"]["field"] == "training_file"
    eval_file = upload(client, team_a, EVAL_MATH, purpose="eval").json()["id"]
    r = client.post("/v1/jobs", headers=team_a.headers, json=job_body(eval_file))
    assert r.status_code == 422 and "purpose" in r.json()["error"]["message"]
    unpaired = upload(client, team_a, UNPAIRED).json()["id"]
    for objective in ("dpo", "grpo"):
        r = client.post(
            "/v1/jobs", headers=team_a.headers, json=job_body(unpaired, objective=objective)
        )
        assert r.status_code == 422 and r.json()["error"]["field"] == "training_file"
        assert "preference" in r.json()["error"]["message"]
    assert job_rows(db_sessions) == 0


@pytest.mark.parametrize("body", ["not json", "[1, 2]", "{", ""])
def test_malformed_bodies_are_4xx_never_500(client, team_a, body):
    r = client.post(
        "/v1/jobs", headers={**team_a.headers, "Content-Type": "application/json"}, content=body
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_oversized_json_body_is_413(client, team_a, train_file):
    r = client.post(
        "/v1/jobs",
        headers=team_a.headers,
        json=job_body(train_file, metadata={"k": "x" * (2 << 20)}),
    )
    assert r.status_code == 413


def test_active_jobs_per_team_are_limited(
    client, team_a, team_b, train_file, settings, db_sessions
):
    ids = [create_job(client, team_a, train_file)["id"] for _ in range(settings.MAX_JOBS_PER_TEAM)]
    r = client.post("/v1/jobs", headers=team_a.headers, json=job_body(train_file))
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
    # the refused job was inserted, counted and rolled back: no row, no event left
    assert job_rows(db_sessions) == len(ids)
    with db_sessions() as s:
        assert s.scalar(select(func.count(func.distinct(JobEvent.job_id)))) == len(ids)
    other_file = upload(client, team_b).json()["id"]
    create_job(client, team_b, other_file)  # other teams are unaffected
    client.post(f"/v1/jobs/{ids[0]}/cancel", headers=team_a.headers)
    create_job(client, team_a, train_file)


def test_enqueue_failure_does_not_fail_the_request(client, team_a, train_file, queue, monkeypatch):
    def broken(job_id):
        raise ConnectionError("broker down")

    monkeypatch.setattr(queue, "enqueue", broken)
    job = create_job(client, team_a, train_file)
    assert job["status"] == "queued"  # the sweep (stale_queued) will send it again


def test_a_batch_the_user_set_larger_than_the_data_is_refused(client, team_a, train_file):
    r = client.post("/v1/jobs", headers=team_a.headers, json=job_body(train_file, batch_size=8))
    assert r.status_code == 422 and r.json()["error"]["field"] == "batch_size"
    assert "needs 8 training examples per step" in r.json()["error"]["message"]
    assert "has 4" in r.json()["error"]["message"]


def test_a_default_batch_larger_than_the_data_is_fitted_with_a_warning(client, team_a, train_file):
    body = job_body(train_file)
    del body["batch_size"]  # DPO's default: 32 pairs, the file has 4
    r = client.post("/v1/jobs", headers=team_a.headers, json=body)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["spec"]["batch_size"] == 4 and job["total_steps"] == 1
    events = client.get(f"/v1/jobs/{job['id']}/events", headers=team_a.headers).json()["data"]
    (warning,) = [e for e in events if e["kind"] == "warning"]
    assert "default batch of 32 pairs is larger than the 4 examples" in warning["message"]


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"checkpoint_every": 2**64}, "checkpoint_every"),
        ({"log_every": 2**64}, "log_every"),
        ({"checkpoint_every": 2**31}, "checkpoint_every"),
    ],
)
def test_integers_too_large_to_store_or_render_are_422_and_leave_no_job(
    client, team_a, train_file, queue, db_sessions, overrides, field
):
    """A seed of 2**64 was committed and enqueued, then the response could not be rendered
    (orjson takes 64-bit integers only): a 500 over a job that runs."""
    r = client.post("/v1/jobs", headers=team_a.headers, json=job_body(train_file, **overrides))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field
    assert job_rows(db_sessions) == 0 and queue.job_ids == []


def test_the_extreme_seeds_are_accepted_and_returned(client, team_a, train_file):
    for seed in (2**63 - 1, -(2**63)):
        assert create_job(client, team_a, train_file, seed=seed)["spec"]["seed"] == seed


def test_a_response_that_cannot_be_rendered_leaves_no_job_behind(
    app, team_a, train_file, queue, db_sessions, monkeypatch
):
    """The body is rendered before the commit: whatever fails there, no job is committed
    and enqueued behind a 500."""
    from types import SimpleNamespace

    from fastapi.testclient import TestClient

    import api.routes.jobs as routes

    def unrenderable(body):
        raise TypeError("Integer exceeds 64-bit range")

    monkeypatch.setattr(routes, "orjson", SimpleNamespace(dumps=unrenderable))
    r = TestClient(app, raise_server_exceptions=False).post(
        "/v1/jobs", headers=team_a.headers, json=job_body(train_file)
    )
    assert r.status_code == 500
    assert job_rows(db_sessions) == 0 and queue.job_ids == []


@pytest.mark.parametrize("metadata", [{"note": "a\ud800b"}, {"note": "\udfff"}])
def test_text_that_is_not_unicode_is_422_on_both_backends_and_leaves_no_job(
    client, team_a, train_file, queue, db_sessions, metadata
):
    """A lone surrogate ("\\ud800" in the JSON) cannot be stored: PostgreSQL refused it, and
    SQLite stored it, after which every read of the team's jobs was a 500. Now both refuse it
    with the same 422 (models.db.UnstorableValue), before anything is committed."""
    body = json.dumps(job_body(train_file, metadata=metadata))  # the escape, as a client sends it
    headers = {**team_a.headers, "Content-Type": "application/json"}
    r = client.post("/v1/jobs", headers=headers, content=body)
    assert r.status_code == 422 and "cannot be stored" in r.json()["error"]["message"], r.text
    assert job_rows(db_sessions) == 0 and queue.job_ids == []
    assert client.get("/v1/jobs", headers=team_a.headers).status_code == 200


def test_an_sft_job_takes_an_openai_chat_file(client, team_a, queue):
    line = {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello.", "weight": 0},
            {"role": "user", "content": "1+1?"},
            {"role": "assistant", "content": "2."},
        ]
    }
    content = ("\n".join(json.dumps(line) for _ in range(4)) + "\n").encode()
    f = upload(client, team_a, content).json()
    assert f["format"] == "sft"
    job = create_job(client, team_a, f["id"], objective={"name": "sft", "packing": True})
    assert job["objective"] == "sft" and job["variant"] == "offline"
    assert job["spec"]["objective"] == {"name": "sft", "packing": True}
    assert job["spec"]["reference_sync"] == "none" and queue.job_ids == [job["id"]]
