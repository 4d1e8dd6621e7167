"""One exception class per status family, each carrying status_code, message, type, field,
errors and request_id. Real API answers where the API has them; the fault injector for
statuses it never sends (403, 500)."""

from __future__ import annotations

import pytest

from humanline_client import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    Client,
    ConflictError,
    HumanlineError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    RequestTooLargeError,
    UnprocessableEntityError,
)
from humanline_client._exceptions import status_error_class

from .conftest import PREFERENCE


def test_400_bad_request(client):
    with pytest.raises(BadRequestError) as info:
        client.files.upload(file=PREFERENCE, idempotency_key="has spaces")
    err = info.value
    assert type(err) is BadRequestError and err.status_code == 400
    assert err.field == "Idempotency-Key" and err.type == "invalid_request_error"
    assert err.request_id and err.request_id == err.response.headers["x-request-id"]
    assert "400" in str(err) and err.request_id in str(err)


def test_401_authentication(server):
    with (
        Client(base_url=server.url, api_key="hl_not-a-key") as bad,
        pytest.raises(AuthenticationError) as info,
    ):
        bad.jobs.list().first_page()
    assert info.value.status_code == 401 and "invalid" in info.value.message


def test_missing_api_key_fails_at_construction(monkeypatch):
    monkeypatch.delenv("HUMANLINE_API_KEY", raising=False)
    with pytest.raises(HumanlineError, match="HUMANLINE_API_KEY"):
        Client(base_url="http://127.0.0.1:1")


def test_403_permission_denied(server, client):
    token = server.faults.plan(("status", 403, {}))
    with pytest.raises(PermissionDeniedError) as info:
        client.with_options(default_headers={"X-Test-Fault": token}).files.list().first_page()
    assert info.value.status_code == 403 and info.value.message == "injected 403"


def test_404_not_found(client):
    with pytest.raises(NotFoundError) as info:
        client.jobs.retrieve("job-nope")
    assert info.value.status_code == 404 and info.value.field == "job_id"


def test_409_conflict(client, train_file):
    job = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    client.jobs.cancel(job.id)
    with pytest.raises(ConflictError) as info:
        client.jobs.cancel(job.id)
    assert info.value.status_code == 409 and "already cancelled" in info.value.message


def test_409_idempotency_key_reused_with_another_body(client, train_file):
    client.jobs.create(
        base_model="tiny-llama", training_file=train_file, objective="dpo", idempotency_key="k1"
    )
    with pytest.raises(ConflictError) as info:
        client.jobs.create(
            base_model="tiny-llama", training_file=train_file, objective="kto", idempotency_key="k1"
        )
    assert info.value.field == "Idempotency-Key"


def test_413_request_too_large(client, server):
    big = PREFERENCE * (server.settings.MAX_UPLOAD_BYTES // len(PREFERENCE) + 2)
    with pytest.raises(RequestTooLargeError) as info:
        client.files.upload(file=big)
    assert info.value.status_code == 413 and isinstance(info.value, BadRequestError)


def test_422_unprocessable_with_every_error(client, train_file):
    with pytest.raises(UnprocessableEntityError) as info:
        client.jobs.create(
            base_model="tiny-llama",
            training_file=train_file,
            objective={"name": "dpo", "beta": -1},
            batch_size=0,
        )
    err = info.value
    assert err.status_code == 422 and isinstance(err, BadRequestError)
    fields = {e["field"] for e in err.errors}
    assert {"objective.dpo.beta", "batch_size"} <= fields
    assert err.field in fields and "more errors" in str(err)


def test_429_rate_limit(server, client):
    token = server.faults.plan(("status", 429, {"Retry-After": "0"}))
    with pytest.raises(RateLimitError) as info:
        client.with_options(
            max_retries=0, default_headers={"X-Test-Fault": token}
        ).jobs.list().first_page()
    assert info.value.status_code == 429


def test_5xx_internal_server_error(server, client):
    token = server.faults.plan(("status", 500, {}), ("status", 502, {}))
    faulty = client.with_options(max_retries=0, default_headers={"X-Test-Fault": token})
    for code in (500, 502):
        with pytest.raises(InternalServerError) as info:
            faulty.files.list().first_page()
        assert info.value.status_code == code and info.value.request_id == "fault"


def test_other_statuses_map_to_a_family():
    assert status_error_class(418) is BadRequestError
    assert status_error_class(599) is InternalServerError
    assert status_error_class(302) is APIStatusError


def test_connection_refused(server):
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with (
        Client(base_url=f"http://127.0.0.1:{port}", api_key="hl_x", max_retries=1) as dead,
        pytest.raises(APIConnectionError) as info,
    ):
        dead.files.retrieve("file-x")
    err = info.value
    assert not isinstance(err, APITimeoutError) and err.request_id  # our own request id
    assert f"127.0.0.1:{port}" in str(err)


def test_timeout(server, client):
    token = server.faults.plan(("sleep", 1.0))
    slow = client.with_options(timeout=0.2, max_retries=0, default_headers={"X-Test-Fault": token})
    with pytest.raises(APITimeoutError) as info:
        slow.files.list().first_page()
    assert isinstance(info.value, APIConnectionError) and info.value.request_id
    assert info.value.request_id == server.faults.seen[token][0]["x-request-id"]
