"""/v1/jobs: creation and spec errors, listing, cancel, idempotency, events, SSE, metrics,
checkpoints, and team isolation."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select

from models import jobs as job_states
from models.tables import Job, JobEvent
from tests.api.conftest import EVAL_MATH, UNPAIRED, job_body, upload


def _create(client, team, file_id, **overrides):
    r = client.post("/v1/jobs", headers=team.headers, json=job_body(file_id, **overrides))
    assert r.status_code == 201, r.text
    return r.json()


def _job_rows(db_sessions) -> int:
    with db_sessions() as s:
        return s.execute(select(func.count()).select_from(Job)).scalar_one()


def _claim(db_sessions, job_id, worker="w1"):
    with db_sessions() as s:
        assert job_states.claim(s, job_id, worker, 60) is not None
        s.commit()


def _finish(db_sessions, job_id, status="succeeded", worker="w1"):
    with db_sessions() as s:
        assert job_states.finish(s, job_id, worker, status)
        s.commit()


# --- create ------------------------------------------------------------------------------------


def test_create_commits_a_queued_job_then_enqueues_it(client, team_a, train_file, queue):
    job = _create(
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


def test_kto_accepts_unpaired_data(client, team_a):
    file_id = upload(client, team_a, UNPAIRED).json()["id"]
    assert _create(client, team_a, file_id, objective={"name": "kto"})["objective"] == "kto"


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
    ],
)
def test_bad_specs_are_rejected_with_the_field(
    client, team_a, train_file, queue, db_sessions, overrides, status, field
):
    r = client.post("/v1/jobs", headers=team_a.headers, json=job_body(train_file, **overrides))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["request_id"]
    assert err.get("field") == field
    assert _job_rows(db_sessions) == 0 and queue.job_ids == []


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
    assert _job_rows(db_sessions) == 0


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
    ids = [_create(client, team_a, train_file)["id"] for _ in range(settings.MAX_JOBS_PER_TEAM)]
    r = client.post("/v1/jobs", headers=team_a.headers, json=job_body(train_file))
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
    # the refused job was inserted, counted and rolled back: no row, no event left
    assert _job_rows(db_sessions) == len(ids)
    with db_sessions() as s:
        assert s.scalar(select(func.count(func.distinct(JobEvent.job_id)))) == len(ids)
    other_file = upload(client, team_b).json()["id"]
    _create(client, team_b, other_file)  # other teams are unaffected
    client.post(f"/v1/jobs/{ids[0]}/cancel", headers=team_a.headers)
    _create(client, team_a, train_file)


# --- idempotency ---------------------------------------------------------------------------


def test_idempotent_create_returns_the_original_job(client, team_a, train_file, queue, db_sessions):
    key = {**team_a.headers, "Idempotency-Key": "create-1"}
    first = client.post("/v1/jobs", headers=key, json=job_body(train_file))
    again = client.post("/v1/jobs", headers=key, json=job_body(train_file))
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert again.headers.get("idempotent-replayed") == "true"
    assert _job_rows(db_sessions) == 1 and queue.job_ids == [first.json()["id"]]
    different = client.post("/v1/jobs", headers=key, json=job_body(train_file, seed=7))
    assert different.status_code == 409
    assert different.json()["error"]["field"] == "Idempotency-Key"
    # the same key on another team is another key
    assert _job_rows(db_sessions) == 1


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
    assert _job_rows(db_sessions) == 1 and len(queue.job_ids) == 1


def test_idempotency_loses_the_race_gracefully(
    client, team_a, train_file, db_sessions, monkeypatch
):
    """Between our lookup and our commit another request with the key commits first."""
    from api import deps

    original = deps.Idempotency.replay
    calls = {"n": 0}

    def replay(self, req_hash):
        calls["n"] += 1
        if calls["n"] == 1:  # our first lookup finds nothing; a rival then wins
            with db_sessions() as s:
                job = job_states.create_job(s, team_id=team_a.id, spec={"objective": {}})
                s.add(
                    deps.IdempotencyKey(
                        team_id=team_a.id,
                        key="raced",
                        method_path="POST /v1/jobs",
                        request_hash=req_hash,
                        response_status=201,
                        response_body={"id": job.id, "winner": True},
                    )
                )
                s.commit()
            return None
        return original(self, req_hash)

    monkeypatch.setattr(deps.Idempotency, "replay", replay)
    r = client.post(
        "/v1/jobs",
        headers={**team_a.headers, "Idempotency-Key": "raced"},
        json=job_body(train_file),
    )
    assert r.status_code == 201 and r.json()["winner"] is True
    assert _job_rows(db_sessions) == 1  # ours was rolled back


# --- list ------------------------------------------------------------------------------------


def test_list_paginates_and_filters(client, team_a, team_b, train_file, db_sessions):
    ids = [
        _create(client, team_a, train_file, metadata={"sweep": "a" if i % 2 else "b"})["id"]
        for i in range(5)
    ]
    _create(client, team_b, upload(client, team_b).json()["id"])
    pages, after = [], None
    while True:
        params = {"limit": 2, **({"after": after} if after else {})}
        page = client.get("/v1/jobs", headers=team_a.headers, params=params).json()
        pages.append([j["id"] for j in page["data"]])
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert pages == [ids[4:2:-1], ids[2:0:-1], ids[0:1]]
    by_meta = client.get("/v1/jobs", headers=team_a.headers, params={"metadata[sweep]": "a"}).json()
    assert [j["id"] for j in by_meta["data"]] == [ids[3], ids[1]]
    client.post(f"/v1/jobs/{ids[2]}/cancel", headers=team_a.headers)
    cancelled = client.get("/v1/jobs?status=cancelled", headers=team_a.headers).json()
    assert [j["id"] for j in cancelled["data"]] == [ids[2]]
    both = client.get(
        "/v1/jobs", headers=team_a.headers, params={"status": "queued", "metadata[sweep]": "b"}
    ).json()
    assert [j["id"] for j in both["data"]] == [ids[4], ids[0]]
    bad = client.get("/v1/jobs", headers=team_a.headers, params={"metadata[a b]": "x"})
    assert bad.status_code == 422


# --- cancel ------------------------------------------------------------------------------------


def test_cancel_transitions(client, team_a, train_file, db_sessions):
    queued = _create(client, team_a, train_file)["id"]
    r = client.post(f"/v1/jobs/{queued}/cancel", headers=team_a.headers)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert r.json()["finished_at"] is not None
    again = client.post(f"/v1/jobs/{queued}/cancel", headers=team_a.headers)
    assert again.status_code == 409 and again.json()["error"]["type"] == "conflict_error"

    running = _create(client, team_a, train_file)["id"]
    _claim(db_sessions, running)
    r = client.post(f"/v1/jobs/{running}/cancel", headers=team_a.headers)
    assert r.json()["status"] == "cancelling"
    assert (
        client.post(f"/v1/jobs/{running}/cancel", headers=team_a.headers).json()["status"]
        == "cancelling"
    )
    with db_sessions() as s:
        assert job_states.heartbeat(s, running, "w1", 60) == "cancelling"
        assert job_states.finish(s, running, "w1", "cancelled")
        s.commit()
    assert client.get(f"/v1/jobs/{running}", headers=team_a.headers).json()["status"] == "cancelled"

    done = _create(client, team_a, train_file)["id"]
    _claim(db_sessions, done)
    _finish(db_sessions, done)
    assert client.post(f"/v1/jobs/{done}/cancel", headers=team_a.headers).status_code == 409


def test_idempotent_cancel_replays(client, team_a, train_file):
    job_id = _create(client, team_a, train_file)["id"]
    headers = {**team_a.headers, "Idempotency-Key": "cancel-1"}
    first = client.post(f"/v1/jobs/{job_id}/cancel", headers=headers)
    again = client.post(f"/v1/jobs/{job_id}/cancel", headers=headers)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()


# --- events, stream, metrics, checkpoints ---------------------------------------------------


def test_events_paginate_by_seq(client, team_a, train_file, db_sessions):
    job_id = _create(client, team_a, train_file)["id"]
    with db_sessions() as s:
        for i in range(5):
            job_states.add_event(s, job_id, "log", f"line {i}", {"i": i})
        s.commit()
    page = client.get(f"/v1/jobs/{job_id}/events?limit=3", headers=team_a.headers).json()
    assert [e["seq"] for e in page["data"]] == [1, 2, 3] and page["has_more"]
    rest = client.get(
        f"/v1/jobs/{job_id}/events", headers=team_a.headers, params={"after": page["last_id"]}
    ).json()
    assert [e["seq"] for e in rest["data"]] == [4, 5, 6, 7] and not rest["has_more"]
    assert rest["data"][-1] | {"created_at": None} == {
        "seq": 7,
        "object": "job.event",
        "kind": "log",
        "message": "line 4",
        "data": {"i": 4},
        "created_at": None,
    }


def _parse_sse(text: str) -> list[dict]:
    out = []
    for block in text.strip().split("\n\n"):
        fields = {}
        for line in block.splitlines():
            if line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if "event" in fields:
            out.append(fields)
    return out


def test_event_stream_follows_the_job_and_ends_when_it_is_terminal(
    client, team_a, train_file, db_sessions
):
    job_id = _create(client, team_a, train_file)["id"]

    def run_the_job():
        time.sleep(0.2)
        _claim(db_sessions, job_id)
        with db_sessions() as s:
            job_states.add_event(s, job_id, "log", "step 1")
            s.commit()
        time.sleep(0.1)
        _finish(db_sessions, job_id)

    worker = threading.Thread(target=run_the_job)
    worker.start()
    r = client.get(f"/v1/jobs/{job_id}/events/stream", headers=team_a.headers)
    worker.join()
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _parse_sse(r.text)
    assert [e["event"] for e in events] == ["created", "status", "status", "log", "status", "end"]
    assert [e.get("id") for e in events[:-1]] == ["1", "2", "3", "4", "5"]
    assert '"status": "succeeded"' in events[-1]["data"]


def test_event_stream_resumes_after_last_event_id(client, team_a, train_file):
    job_id = _create(client, team_a, train_file)["id"]
    client.post(f"/v1/jobs/{job_id}/cancel", headers=team_a.headers)
    r = client.get(
        f"/v1/jobs/{job_id}/events/stream", headers={**team_a.headers, "Last-Event-ID": "2"}
    )
    events = _parse_sse(r.text)
    assert [(e["event"], e.get("id")) for e in events] == [("status", "3"), ("end", None)]


def test_metrics_range(client, team_a, train_file, db_sessions):
    job_id = _create(client, team_a, train_file)["id"]
    with db_sessions() as s:
        for step in range(1, 11):
            job_states.record_metrics(s, job_id, step, {"loss": 1.0 / step})
        s.commit()
    url = f"/v1/jobs/{job_id}/metrics"
    every = client.get(url, headers=team_a.headers).json()
    assert [m["step"] for m in every["data"]] == list(range(1, 11)) and not every["has_more"]
    window = client.get(url, headers=team_a.headers, params={"from_step": 3, "to_step": 5})
    assert [m["step"] for m in window.json()["data"]] == [3, 4, 5]
    assert window.json()["data"][0]["values"] == {"loss": pytest.approx(1 / 3)}
    paged = client.get(url, headers=team_a.headers, params={"from_step": 8, "limit": 2}).json()
    assert [m["step"] for m in paged["data"]] == [8, 9] and paged["has_more"]
    bad = client.get(url, headers=team_a.headers, params={"from_step": 5, "to_step": 2})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "to_step"
    neg = client.get(url, headers=team_a.headers, params={"from_step": -1})
    assert neg.status_code == 422 and neg.json()["error"]["field"] == "from_step"


@pytest.fixture
def job_with_checkpoint(client, team_a, train_file, db_sessions, store, tmp_path):
    from storage.keys import checkpoint_prefix

    job_id = _create(client, team_a, train_file)["id"]
    ckpt_dir = tmp_path / "ckpt"
    (ckpt_dir / "tokenizer").mkdir(parents=True)
    (ckpt_dir / "model.safetensors").write_bytes(b"\x00weights" * 100)
    (ckpt_dir / "tokenizer" / "vocab.json").write_text("{}")
    prefix = checkpoint_prefix(team_a.id, job_id, 4)
    store.upload_dir(prefix, ckpt_dir)
    with db_sessions() as s:
        job_states.add_checkpoint(
            s, job_id, 4, prefix, bytes=802, files=["model.safetensors", "tokenizer/vocab.json"]
        )
        s.commit()
    return job_id


def test_checkpoints_list_and_download(client, team_a, job_with_checkpoint):
    job_id = job_with_checkpoint
    listing = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=team_a.headers).json()
    assert [(c["step"], c["bytes"], c["files"]) for c in listing["data"]] == [
        (4, 802, ["model.safetensors", "tokenizer/vocab.json"])
    ]
    url = f"/v1/jobs/{job_id}/checkpoints/4/download"
    r = client.get(url, headers=team_a.headers, params={"file": "model.safetensors"})
    assert r.status_code == 200 and r.content == b"\x00weights" * 100
    assert 'filename="model.safetensors"' in r.headers["content-disposition"]
    nested = client.get(url, headers=team_a.headers, params={"file": "tokenizer/vocab.json"})
    assert nested.status_code == 200 and nested.content == b"{}"


@pytest.mark.parametrize(
    "name",
    [
        "../../../etc/passwd",
        "missing.bin",
        "/model.safetensors",
        "tokenizer/../model.safetensors",
        "step-4/model.safetensors",
    ],
)
def test_checkpoint_download_serves_only_listed_files(client, team_a, job_with_checkpoint, name):
    r = client.get(
        f"/v1/jobs/{job_with_checkpoint}/checkpoints/4/download",
        headers=team_a.headers,
        params={"file": name},
    )
    assert r.status_code == 404 and r.json()["error"]["field"] == "file"


def test_checkpoint_download_of_a_missing_step_is_404(client, team_a, job_with_checkpoint):
    r = client.get(
        f"/v1/jobs/{job_with_checkpoint}/checkpoints/5/download",
        headers=team_a.headers,
        params={"file": "model.safetensors"},
    )
    assert r.status_code == 404 and r.json()["error"]["field"] == "step"


def test_checkpoint_download_redirects_to_a_presigned_url(
    client, team_a, job_with_checkpoint, store, monkeypatch
):
    monkeypatch.setattr(
        store, "presigned_url", lambda key, expires=3600: f"https://s3.example/{key}?sig=1"
    )
    r = client.get(
        f"/v1/jobs/{job_with_checkpoint}/checkpoints/4/download",
        headers=team_a.headers,
        params={"file": "model.safetensors"},
        follow_redirects=False,
    )
    assert r.status_code == 307
    assert r.headers["location"].startswith("https://s3.example/")
    assert r.headers["location"].endswith("/step-4/model.safetensors?sig=1")


def test_teams_cannot_see_or_touch_each_others_jobs(
    client, team_a, team_b, job_with_checkpoint, queue
):
    job_id = job_with_checkpoint
    for method, path, params in [
        ("GET", f"/v1/jobs/{job_id}", None),
        ("POST", f"/v1/jobs/{job_id}/cancel", None),
        ("GET", f"/v1/jobs/{job_id}/events", None),
        ("GET", f"/v1/jobs/{job_id}/events/stream", None),
        ("GET", f"/v1/jobs/{job_id}/metrics", None),
        ("GET", f"/v1/jobs/{job_id}/checkpoints", None),
        ("GET", f"/v1/jobs/{job_id}/checkpoints/4/download", {"file": "model.safetensors"}),
    ]:
        r = client.request(method, path, headers=team_b.headers, params=params)
        assert r.status_code == 404, (method, path, r.text)
        assert r.json()["error"]["type"] == "not_found_error"
    assert client.get("/v1/jobs", headers=team_b.headers).json()["data"] == []
    assert client.get(f"/v1/jobs/{job_id}", headers=team_a.headers).json()["status"] == "queued"


def test_enqueue_failure_does_not_fail_the_request(client, team_a, train_file, queue, monkeypatch):
    def broken(job_id):
        raise ConnectionError("broker down")

    monkeypatch.setattr(queue, "enqueue", broken)
    job = _create(client, team_a, train_file)
    assert job["status"] == "queued"  # the sweep (stale_queued) will send it again


def test_exported_model_downloads_once_the_job_succeeded(client, team_a, team_b, train_file, db_sessions, store, tmp_path):
    from storage.keys import job_prefix

    job_id = _create(client, team_a, train_file)["id"]
    url = f"/v1/jobs/{job_id}/model/download"
    early = client.get(url, headers=team_a.headers, params={"file": "adapter_model.safetensors"})
    assert early.status_code == 404 and early.json()["error"]["field"] == "job_id"
    final = tmp_path / "final"
    final.mkdir()
    (final / "adapter_model.safetensors").write_bytes(b"\x01adapter")
    prefix = job_prefix(team_a.id, job_id) + "final/"
    store.upload_dir(prefix, final)
    _claim(db_sessions, job_id)
    with db_sessions() as s:
        result = {"final_model": {"prefix": prefix, "files": ["adapter_model.safetensors"]}}
        assert job_states.finish(s, job_id, "w1", "succeeded", result=result)
        s.commit()
    ok = client.get(url, headers=team_a.headers, params={"file": "adapter_model.safetensors"})
    assert ok.status_code == 200 and ok.content == b"\x01adapter"
    for name in ("../final/adapter_model.safetensors", "_COMPLETE/../x", "missing"):
        r = client.get(url, headers=team_a.headers, params={"file": name})
        assert r.status_code == 404 and r.json()["error"]["field"] == "file", name
    other = client.get(url, headers=team_b.headers, params={"file": "adapter_model.safetensors"})
    assert other.status_code == 404
