"""`Client` and `AsyncClient`: configuration plus the resource namespaces (each annotated
attribute whose type is a resource is made when a client is: `client.files = Files(client)`)."""

from __future__ import annotations

from typing import Any, TypeVar, get_type_hints

from ._base_client import AsyncAPIClient, BaseClient, SyncAPIClient
from ._resource import APIResource
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

C = TypeVar("C", bound="type[BaseClient[Any]]")


def with_resources(cls: C) -> C:
    """Makes each annotation of `cls` whose type is an API resource with every client:
    `files: Files` → `client.files = Files(client)`."""
    cls._resources = tuple(
        (name, hint)
        for name, hint in get_type_hints(cls).items()
        if isinstance(hint, type) and issubclass(hint, APIResource)
    )
    return cls


@with_resources
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


@with_resources
class AsyncClient(AsyncAPIClient):
    """The Humanline API for asyncio: `async with AsyncClient() as client:`; the same
    resources and options as Client, with awaitable methods and `async for` listings."""

    files: AsyncFiles
    jobs: AsyncJobs
    evaluations: AsyncEvaluations
    reports: AsyncReports
    webhooks: AsyncWebhooks
