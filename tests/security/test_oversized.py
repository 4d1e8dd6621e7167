"""Oversized input: bodies (with or without Content-Length) are 413 and leave nothing stored;
oversized headers are 4xx, in process and on a real server."""

from __future__ import annotations

from tests.api.conftest import stored_objects, upload


def test_oversized_bodies_are_413(client, team_a, settings, store):
    big = b'{"prompt": "x", "chosen": "a", "rejected": "b"}\n' * (settings.MAX_UPLOAD_BYTES // 40)
    r = upload(client, team_a, big)
    assert r.status_code == 413, r.status_code
    assert stored_objects(store) == []
    r = client.post(
        "/v1/jobs",
        headers={**team_a.headers, "Content-Type": "application/json"},
        content=b'{"base_model": "' + b"x" * (8 << 20) + b'"}',
    )
    assert r.status_code == 413, r.status_code
    line = (
        b'{"prompt": "' + b"x" * settings.MAX_LINE_BYTES + b'", "chosen": "a", "rejected": "b"}\n'
    )
    r = upload(client, team_a, line)
    assert r.status_code == 422 and "longer than" in r.text


def _chunks(body: bytes, size: int = 64 * 1024):
    """A body sent chunked: httpx sends no Content-Length for an iterator."""
    for i in range(0, len(body), size):
        yield body[i : i + size]


def test_oversized_bodies_without_content_length_are_413(client, team_a, settings, store):
    """The Content-Length check alone never saw a chunked body: the limit is also counted as
    the body arrives (observability.RequestMiddleware's receive wrapper)."""
    boundary = "hl-boundary"
    rows = b'{"prompt": "x", "chosen": "a", "rejected": "b"}\n' * (settings.MAX_UPLOAD_BYTES // 40)
    multipart = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\ntrain\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="d.jsonl"\r\n'
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode() + rows + f"\r\n--{boundary}--\r\n".encode()
    sent = []

    def observed(request):
        sent.append(request.headers.get("content-length"))

    client.event_hooks["request"].append(observed)
    r = client.post(
        "/v1/files", content=_chunks(multipart),
        headers={**team_a.headers, "Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert r.status_code == 413, r.text
    assert stored_objects(store) == []
    r = client.post(
        "/v1/jobs", content=_chunks(b'{"base_model": "' + b"x" * (8 << 20) + b'"}'),
        headers={**team_a.headers, "Content-Type": "application/json"},
    )
    assert r.status_code == 413, r.text
    assert sent == [None, None]  # no Content-Length was sent: the counting refused them
    small = multipart.replace(rows, rows[: 48 * 4])  # the same request, within the limit
    r = client.post(
        "/v1/files", content=_chunks(small),
        headers={**team_a.headers, "Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert r.status_code == 201, r.text


def test_oversized_headers_are_4xx_on_a_real_server(live_server):
    import httpx

    base, key = live_server
    with httpx.Client(base_url=base, timeout=10) as http:
        r = http.get("/v1/jobs", headers={"Authorization": f"Bearer {key}", "X-Big": "x" * 70000})
        assert 400 <= r.status_code < 500, r.status_code
        r = http.get("/v1/jobs", headers={"Authorization": "Bearer " + "x" * 70000})
        assert 400 <= r.status_code < 500, r.status_code
        many = {f"X-H{i}": "y" * 100 for i in range(1000)}
        r = http.get("/v1/jobs", headers={"Authorization": f"Bearer {key}", **many})
        assert 400 <= r.status_code < 500, r.status_code
        assert http.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_oversized_headers_are_431_in_process(client, team_a):
    """Regression: uvicorn's default parser (httptools) accepted 70 KB of headers; the app
    now refuses more than MAX_HEADER_BYTES itself, whatever the server."""
    from api.observability import MAX_HEADER_BYTES

    r = client.get("/v1/jobs", headers={**team_a.headers, "X-Big": "x" * MAX_HEADER_BYTES})
    assert r.status_code == 431 and r.json()["error"]["type"] == "invalid_request_error"
    assert client.get("/v1/jobs", headers={**team_a.headers, "X-Ok": "x" * 4000}).status_code == 200
