"""S3 outages: a short one is ridden out, a long one ends in a clean, explicit error.

These stop and restart the session's SeaweedFS; each leaves it running."""

from __future__ import annotations

import threading
import time

import botocore.exceptions
import pytest

from storage import StorageUnavailableError


@pytest.fixture
def outage_store(s3_server):
    # A bucket of its own, deleted afterwards rather than recycled: a request cut by the
    # outage may still be applied by the server later.
    bucket = s3_server.new_bucket("outage")
    yield s3_server.store(bucket, max_attempts=2, connect_timeout=1.0, read_timeout=5.0)
    if not s3_server.running:
        s3_server.start()
    s3_server.delete_bucket(bucket)


def test_outage_past_the_deadline_is_a_clean_error(s3_server, outage_store):
    outage_store.put_bytes("t1/files/f.jsonl", b"data")
    outage_store.retry_deadline_s = 1.5
    s3_server.stop(grace=0)
    try:
        t0 = time.monotonic()
        with pytest.raises(StorageUnavailableError) as info:
            outage_store.get_stream("t1/files/f.jsonl")
        elapsed = time.monotonic() - t0
        assert elapsed < 10, elapsed
        msg = str(info.value)
        assert s3_server.endpoint_url in msg and "t1/files/f.jsonl" in msg and "get" in msg
        with pytest.raises(StorageUnavailableError):
            outage_store.put_bytes("t1/files/g.jsonl", b"x")
    finally:
        s3_server.start()
    assert outage_store.get_bytes("t1/files/f.jsonl") == b"data"  # nothing lost


def test_outage_within_the_deadline_is_survived(s3_server, outage_store, tmp_path):
    outage_store.put_bytes("t1/files/f.jsonl", b"data")
    outage_store.retry_deadline_s = 20.0
    src = tmp_path / "weights.bin"
    src.write_bytes(b"w" * 1000)
    s3_server.stop(grace=0)
    restarter = threading.Timer(1.0, s3_server.start)
    restarter.start()
    try:
        t0 = time.monotonic()
        assert outage_store.get_bytes("t1/files/f.jsonl") == b"data"
        outage_store.put_file("t1/job1/step-1/weights.bin", src)
        assert time.monotonic() - t0 < 20
    finally:
        restarter.join()
    assert outage_store.size("t1/job1/step-1/weights.bin") == 1000
    assert outage_store.list("") == ["t1/files/f.jsonl", "t1/job1/step-1/weights.bin"]


def test_get_stream_resumes_a_dropped_connection(s3_store, monkeypatch):
    """A body that dies mid-way is resumed with a ranged GET pinned to the ETag."""
    data = bytes(range(256)) * 4096  # 1 MiB
    s3_store.put_bytes("k", data)
    real_get = s3_store._client.get_object
    calls: list[dict] = []

    class DyingBody:
        def __init__(self, inner):
            self.inner = inner

        def iter_chunks(self, size):
            it = self.inner.iter_chunks(size)
            yield next(it)
            raise botocore.exceptions.ResponseStreamingError(error="connection reset")

        def close(self):
            self.inner.close()

    def flaky_get(**kwargs):
        calls.append(kwargs)
        resp = real_get(**kwargs)
        if len(calls) == 1:
            resp["Body"] = DyingBody(resp["Body"])
        return resp

    monkeypatch.setattr(s3_store._client, "get_object", flaky_get)
    assert b"".join(s3_store.get_stream("k", chunk_size=100_000)) == data
    assert len(calls) == 2
    assert calls[1]["Range"] == "bytes=100000-"
    assert "IfMatch" in calls[1]
