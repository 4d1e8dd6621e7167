"""`Client` and `AsyncClient`: configuration plus the resource namespaces (each annotated
attribute whose type is a resource is made when a client is: `client.files = Files(client)`)."""

from __future__ import annotations

from ._base_client import AsyncAPIClient, SyncAPIClient
from .resources import (
    AsyncEvaluations,
    AsyncFiles,
    AsyncJobs,
    AsyncReports,
    AsyncWebhooks,
    Evaluations,
    Files,
    Jobs,
    Reports,
    Webhooks,
)

__all__ = ["AsyncClient", "Client"]


class Client(SyncAPIClient):
    """The Humanline API, synchronously.

        client = Client()                      # HUMANLINE_BASE_URL, HUMANLINE_API_KEY
        f = client.files.upload(file="prefs.jsonl")
        job = client.jobs.create(base_model="smollm2-135m-instruct", training_file=f.id,
                                 objective="dpo", variant="offline+humanline")
        job = client.jobs.wait(job.id)
        client.jobs.download_model(job.id, "model/")
        ev = client.evaluations.create(job_id=job.id, file_id=eval_file_id, kind="math")
        ev = client.evaluations.wait(ev.id)

    base_url: the server root (default $HUMANLINE_BASE_URL, else http://127.0.0.1:8000);
    a trailing /v1 is accepted. api_key: default $HUMANLINE_API_KEY. timeout: seconds or an
    httpx.Timeout (default 60 s, 10 s to connect) per attempt. max_retries: retries of a
    failed attempt (default 2; see the retry rules in _retries). default_headers: sent with
    every request. http_client: an httpx.Client to use (not closed by `close()`). The client
    is thread-safe; close it (or use `with`) to release its connections. `with_options(...)`
    is a copy with other settings that shares the connection pool.
    """

    files: Files
    jobs: Jobs
    evaluations: Evaluations
    reports: Reports
    webhooks: Webhooks


class AsyncClient(AsyncAPIClient):
    """The Humanline API for asyncio: `async with AsyncClient() as client:`; the same
    resources and options as Client, with awaitable methods and `async for` listings."""

    files: AsyncFiles
    jobs: AsyncJobs
    evaluations: AsyncEvaluations
    reports: AsyncReports
    webhooks: AsyncWebhooks
