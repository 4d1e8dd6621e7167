"""Retries with backoff on connection errors, timeouts, 408/429/5xx (Retry-After honoured),
not on final answers (404, 409 without Retry-After); one Idempotency-Key per create, reused by
its retries, so a create whose answer was lost is not duplicated."""

from __future__ import annotations

import email.utils
import time

import httpx
import pytest

from humanline_client import APITimeoutError, ConflictError, InternalServerError, NotFoundError
from humanline_client._base_client import SyncAPIClient, _retry_after, should_retry

from .conftest import PREFERENCE


def faulty(client, server, *actions, **options):
    token = server.faults.plan(*actions)
    return token, client.with_options(default_headers={"X-Test-Fault": token}, **options)


def test_create_retried_through_503_and_429_with_one_idempotency_key(
    client, server, team, train_file
):
    token, c = faulty(
        client, server, ("status", 503, {"Retry-After": "0"}), ("status", 429, {"Retry-After": "0"})
    )
    job = c.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    seen = server.faults.seen[token]
    assert len(seen) == 3 and job.status == "queued"
    keys = {h["idempotency-key"] for h in seen}
    assert len(keys) == 1 and keys.pop().startswith("hl-")
    assert len({h["x-request-id"] for h in seen}) == 3  # one request id per attempt
    assert server.job_count(team[0]) == 1


def test_lost_answer_after_commit_is_replayed_not_duplicated(client, server, team, train_file):
    """The server creates the job, then the answer is lost (503 from a proxy): the retry carries
    the same Idempotency-Key, so the server replays the original job."""
    token, c = faulty(client, server, ("after", 503), ("after", 502))
    job = c.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    assert len(server.faults.seen[token]) == 3
    assert server.job_count(team[0]) == 1
    assert [j.id for j in client.jobs.list()] == [job.id]


def test_timed_out_create_is_retried_and_not_duplicated(client, server, team, train_file):
    """The first attempt is processed but answers after the client's timeout."""
    token, c = faulty(client, server, ("late", 1.0), timeout=0.4, max_retries=2)
    job = c.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    assert len(server.faults.seen[token]) == 2
    assert server.job_count(team[0]) == 1 and client.jobs.retrieve(job.id).id == job.id


def test_upload_is_sent_whole_again_on_retry(client, server, tmp_path):
    path = tmp_path / "prefs.jsonl"
    path.write_bytes(PREFERENCE)
    token, c = faulty(client, server, ("after", 503), ("status", 500, {"Retry-After": "0"}))
    f = c.files.upload(file=path)
    assert f.bytes == len(PREFERENCE) and len(server.faults.seen[token]) == 3
    assert [x.id for x in client.files.list()] == [f.id]  # one file, not two
    assert client.files.content(f.id) == PREFERENCE
    with open(path, "rb") as fh:  # a file object is rewound for the retry
        token, c = faulty(client, server, ("status", 503, {"Retry-After": "0"}))
        assert c.files.upload(file=fh).bytes == len(PREFERENCE)


def test_cancel_retry_replays_instead_of_conflicting(client, server, train_file):
    job = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    token, c = faulty(client, server, ("after", 503))
    assert c.jobs.cancel(job.id).status == "cancelled"  # not a 409 "already cancelled"
    assert len(server.faults.seen[token]) == 2


def test_retry_after_is_honoured(client, server):
    _, c = faulty(client, server, ("status", 503, {"Retry-After": "0.6"}))
    started = time.monotonic()
    c.files.list().first_page()
    assert time.monotonic() - started >= 0.6
    _, c = faulty(client, server, ("status", 429, {"retry-after-ms": "300"}))
    started = time.monotonic()
    c.files.list().first_page()
    assert 0.3 <= time.monotonic() - started < 2


def test_gives_up_after_max_retries(client, server):
    token, c = faulty(client, server, *[("status", 503, {"Retry-After": "0"})] * 3, max_retries=2)
    with pytest.raises(InternalServerError):
        c.files.list().first_page()
    assert len(server.faults.seen[token]) == 3


def test_final_answers_are_not_retried(client, server):
    token, c = faulty(client, server, ("status", 409, {}))
    with pytest.raises(ConflictError):
        c.files.list().first_page()
    assert len(server.faults.seen[token]) == 1
    token, c = faulty(client, server, "pass")
    with pytest.raises(NotFoundError):
        c.files.retrieve("file-nope")
    assert len(server.faults.seen[token]) == 1
    token, c = faulty(client, server, ("status", 503, {"x-should-retry": "false"}))
    with pytest.raises(InternalServerError):
        c.files.list().first_page()
    assert len(server.faults.seen[token]) == 1


def test_409_is_retried_when_the_server_says_so(client, server):
    token, c = faulty(client, server, ("status", 409, {"Retry-After": "0"}))
    assert c.files.list().first_page().data == []
    assert len(server.faults.seen[token]) == 2


def test_timeouts_are_retried_then_raised(client, server):
    token, c = faulty(client, server, ("sleep", 1.0), ("sleep", 1.0), timeout=0.2, max_retries=1)
    with pytest.raises(APITimeoutError):
        c.files.list().first_page()
    assert len(server.faults.seen[token]) == 2
    token, c = faulty(client, server, ("sleep", 1.0), timeout=0.2, max_retries=1)
    assert c.files.list().first_page().data == []  # the retry got through


def test_retry_after_parsing_and_backoff():
    headers = httpx.Headers
    assert _retry_after(headers({"retry-after": "3"})) == 3
    assert _retry_after(headers({"retry-after-ms": "250"})) == 0.25
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 < _retry_after(headers({"retry-after": future})) <= 30
    assert _retry_after(headers({"retry-after": "soon"})) is None
    base = SyncAPIClient(
        base_url="http://x", api_key="hl_x", timeout=1, max_retries=2, default_headers={}
    )
    for attempt, cap in enumerate([0.5, 1.0, 2.0, 4.0, 8.0, 8.0]):
        delay = base._retry_delay(attempt, None)
        assert 0.75 * cap <= delay <= cap
    huge = httpx.Response(503, headers={"retry-after": "3600"})
    assert base._retry_delay(0, huge) <= 0.5  # an absurd Retry-After falls back to backoff

    def resp(code, **h):
        return httpx.Response(code, headers=h)

    assert [should_retry(resp(c)) for c in (408, 429, 500, 502, 503, 504)] == [True] * 6
    assert [should_retry(resp(c)) for c in (400, 401, 404, 409, 422, 501)] == [False] * 6
    assert should_retry(resp(409, **{"retry-after": "1"}))
    assert should_retry(resp(400, **{"x-should-retry": "true"}))
