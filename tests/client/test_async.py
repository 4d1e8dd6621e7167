"""AsyncClient: the same resources, awaited, against the same real server."""

from __future__ import annotations

import asyncio
import io
import time

import pytest

from humanline_client import (
    APIConnectionError,
    AsyncClient,
    AsyncCursorPage,
    ConflictError,
    JobWaitTimeout,
    NotFoundError,
    UnprocessableEntityError,
)
from humanline_client._progress import make_progress

from .conftest import PREFERENCE


def run(coro):
    return asyncio.run(coro)


def test_files_async(aclient_args, tmp_path):
    async def go():
        async with AsyncClient(**aclient_args) as client:
            path = tmp_path / "p.jsonl"
            path.write_bytes(PREFERENCE)
            uploaded = [await client.files.upload(file=path)]
            uploaded.append(await client.files.upload(file=io.BytesIO(PREFERENCE)))
            uploaded.append(await client.files.upload(file=PREFERENCE, purpose="train"))
            listing = client.files.list(limit=2)
            first = await listing.first_page()
            assert isinstance(first, AsyncCursorPage) and first.has_more
            second = await first.next_page()
            assert second is not None and not second.has_more
            assert [f.id async for f in listing] == [f.id for f in reversed(uploaded)]
            assert (await client.files.retrieve(uploaded[0].id)).filename == "p.jsonl"
            assert await client.files.content(uploaded[0].id) == PREFERENCE
            dest = await client.files.content(uploaded[0].id, to=tmp_path / "c.jsonl")
            assert dest.read_bytes() == PREFERENCE
            assert (await client.files.delete(uploaded[0].id)).deleted
            with pytest.raises(NotFoundError):
                await client.files.retrieve(uploaded[0].id)
            with pytest.raises(UnprocessableEntityError):
                await client.files.upload(file=b"not json\n")

    run(go())


def test_jobs_async(aclient_args, train_file, driver, tmp_path):
    async def go():
        async with AsyncClient(**aclient_args) as client:
            job = await client.jobs.create(
                base_model="tiny-llama",
                training_file=train_file,
                objective="dpo",
                variant="offline+humanline",
                metadata={"run": "async"},
            )
            assert job.variant == "offline+humanline"
            other = await client.jobs.create(
                base_model="tiny-llama", training_file=train_file, objective="kto"
            )
            assert [j.id async for j in client.jobs.list(limit=1)] == [other.id, job.id]
            assert [j.id for j in await client.jobs.list(metadata={"run": "async"}).to_list()] == [
                job.id
            ]
            assert (await client.jobs.retrieve(job.id)).status == "queued"
            assert (await client.jobs.cancel(other.id)).status == "cancelled"
            with pytest.raises(ConflictError):
                await client.jobs.cancel(other.id)

            worker = driver.in_background(driver.run, job.id, 3, 0.05)
            seen = []

            async def on_event(event):  # coroutine callbacks are awaited
                seen.append(event.seq)

            final = await client.jobs.wait(job.id, on_event=on_event, progress=False)
            worker.join()
            assert final.status == "succeeded" and seen == list(range(1, len(seen) + 1))
            events = [e async for e in client.jobs.events(job.id, limit=2)]
            assert [e.seq for e in events] == seen
            stream = client.jobs.stream_events(job.id, after=2)
            async with stream:
                assert [e.seq async for e in stream] == seen[2:]
            assert stream.status == "succeeded"
            metrics = await client.jobs.metrics(job.id, limit=1).to_list()
            assert [m.step for m in metrics] == [1, 2, 3]
            checkpoints = [c async for c in client.jobs.checkpoints(job.id)]
            assert checkpoints[0].files == ["adapter_model.safetensors"]
            data = await client.jobs.download_checkpoint(
                job.id, step=3, file="adapter_model.safetensors"
            )
            dest = await client.jobs.download_checkpoint(
                job.id, step=3, file="adapter_model.safetensors", to=tmp_path / "w"
            )
            assert data == dest.read_bytes() == b"weights" * 10

    run(go())


def test_async_wait_with_progress_and_timeout(aclient_args, train_file, driver, monkeypatch):
    out = io.StringIO()
    import humanline_client.resources._job_wait as jobs_module

    monkeypatch.setattr(
        jobs_module,
        "make_progress",
        lambda enabled, job_id: make_progress(enabled, job_id, file=out, kind="plain"),
    )

    async def go():
        async with AsyncClient(**aclient_args) as client:
            job = await client.jobs.create(
                base_model="tiny-llama", training_file=train_file, objective="dpo"
            )
            started = time.monotonic()
            with pytest.raises(JobWaitTimeout) as info:  # not wrapped in an ExceptionGroup
                await client.jobs.wait(job.id, timeout=0.3, progress=True, poll_interval=0.05)
            assert info.value.job.status == "queued" and time.monotonic() - started < 5
            worker = driver.in_background(driver.run, job.id, 2, 0.05)
            final = await client.jobs.wait(job.id, progress=True, poll_interval=0.05)
            worker.join()
            return final

    assert run(go()).status == "succeeded"
    assert "step 2/2, loss 0.3500" in out.getvalue()


def test_async_retries_and_connection_errors(server, aclient_args, team):
    async def go():
        token = server.faults.plan(("after", 503), ("status", 429, {"Retry-After": "0"}))
        async with AsyncClient(**aclient_args, default_headers={"X-Test-Fault": token}) as c:
            f = await c.files.upload(file=PREFERENCE)
        assert len(server.faults.seen[token]) == 3
        assert len({h["idempotency-key"] for h in server.faults.seen[token]}) == 1
        async with AsyncClient(**aclient_args) as c:
            assert [x.id async for x in c.files.list()] == [f.id]
        async with AsyncClient(base_url="http://127.0.0.1:9", api_key="hl_x", max_retries=0) as c:
            with pytest.raises(APIConnectionError):
                await c.jobs.retrieve("job-x")

    run(go())
