"""A job's life through /v1/jobs: listing (pages, filters), cancel, events (pages, the SSE
stream and its resumption), metrics."""

from __future__ import annotations

import threading
import time

import pytest

from models import jobs as job_states
from tests.api.conftest import (
    claim_job,
    create_job,
    finish_job,
    upload,
)

# --- list ------------------------------------------------------------------------------------


def test_list_paginates_and_filters(client, team_a, team_b, train_file, db_sessions):
    ids = [
        create_job(client, team_a, train_file, metadata={"sweep": "a" if i % 2 else "b"})["id"]
        for i in range(5)
    ]
    create_job(client, team_b, upload(client, team_b).json()["id"])
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
    queued = create_job(client, team_a, train_file)["id"]
    r = client.post(f"/v1/jobs/{queued}/cancel", headers=team_a.headers)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert r.json()["finished_at"] is not None
    again = client.post(f"/v1/jobs/{queued}/cancel", headers=team_a.headers)
    assert again.status_code == 409 and again.json()["error"]["type"] == "conflict_error"

    running = create_job(client, team_a, train_file)["id"]
    claim_job(db_sessions, running)
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

    done = create_job(client, team_a, train_file)["id"]
    claim_job(db_sessions, done)
    finish_job(db_sessions, done)
    assert client.post(f"/v1/jobs/{done}/cancel", headers=team_a.headers).status_code == 409


# --- events, stream, metrics ---------------------------------------------------------------


def test_events_paginate_by_seq(client, team_a, train_file, db_sessions):
    job_id = create_job(client, team_a, train_file)["id"]
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
    job_id = create_job(client, team_a, train_file)["id"]

    def run_the_job():
        time.sleep(0.2)
        claim_job(db_sessions, job_id)
        with db_sessions() as s:
            job_states.add_event(s, job_id, "log", "step 1")
            s.commit()
        time.sleep(0.1)
        finish_job(db_sessions, job_id)

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
    job_id = create_job(client, team_a, train_file)["id"]
    client.post(f"/v1/jobs/{job_id}/cancel", headers=team_a.headers)
    r = client.get(
        f"/v1/jobs/{job_id}/events/stream", headers={**team_a.headers, "Last-Event-ID": "2"}
    )
    events = _parse_sse(r.text)
    assert [(e["event"], e.get("id")) for e in events] == [("status", "3"), ("end", None)]


@pytest.mark.parametrize(
    "header",
    [b"\xb2", "١".encode(), "1" * 5000, str(2**31), "-1", "3 ", "0x10"],
    ids=["superscript-two", "arabic-one", "5000-digits", "past-int4", "negative", "space", "hex"],
)
def test_a_malformed_last_event_id_is_400_never_500(client, team_a, train_file, header):
    """Issue 14 #9: int() of str.isdigit()'s non-ASCII digits, of 5,000 digits, or a seq past
    PostgreSQL's int4 reached the database once the stream had started: a 500."""
    job_id = create_job(client, team_a, train_file)["id"]
    client.post(f"/v1/jobs/{job_id}/cancel", headers=team_a.headers)  # a stream that ends
    r = client.get(
        f"/v1/jobs/{job_id}/events/stream", headers={**team_a.headers, "Last-Event-ID": header}
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == "Last-Event-ID"
    r = client.get(f"/v1/jobs/{job_id}/events/stream?after={2**31}", headers=team_a.headers)
    assert r.status_code == 422


def test_metrics_range(client, team_a, train_file, db_sessions):
    job_id = create_job(client, team_a, train_file)["id"]
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
