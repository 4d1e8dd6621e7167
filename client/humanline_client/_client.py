"""`Client` and `AsyncClient`: configuration plus the resource namespaces."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import httpx

from ._base_client import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT,
    NOT_GIVEN,
    AsyncAPIClient,
    SyncAPIClient,
    TimeoutTypes,
)
from .resources import (
    AsyncEvaluations,
    AsyncFiles,
    AsyncJobs,
    AsyncReports,
    Evaluations,
    Files,
    Jobs,
    Reports,
)

__all__ = ["AsyncClient", "Client"]


class Client(SyncAPIClient):
    """The Humanline API, synchronously.

        client = Client()                      # HUMANLINE_BASE_URL, HUMANLINE_API_KEY
        f = client.files.upload(file="prefs.jsonl")
        job = client.jobs.create(base_model="smollm2-135m-instruct", training_file=f.id,
                                 objective="dpo", variant="offline+humanline")
        job = client.jobs.wait(job.id)
        ev = client.evaluations.create(job_id=job.id, file_id=eval_file_id, kind="math")
        ev = client.evaluations.wait(ev.id)

    base_url: the server root (default $HUMANLINE_BASE_URL, else http://127.0.0.1:8000);
    a trailing /v1 is accepted. api_key: default $HUMANLINE_API_KEY. timeout: seconds or an
    httpx.Timeout (default 60 s, 10 s to connect) per attempt. max_retries: retries of a
    failed attempt (default 2; see the retry rules in _base_client). The client is
    thread-safe; close it (or use `with`) to release its connections.
    """

    files: Files
    jobs: Jobs
    evaluations: Evaluations
    reports: Reports

    def __init__(
        self,
        *,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: TimeoutTypes = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        default_headers: Optional[Mapping[str, str]] = None,
        http_client: Optional[httpx.Client] = None,
    ) -> None:
        super().__init__(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            default_headers=default_headers,
            http_client=http_client,
        )
        self.files = Files(self)
        self.jobs = Jobs(self)
        self.evaluations = Evaluations(self)
        self.reports = Reports(self)

    def with_options(
        self,
        *,
        timeout: Any = NOT_GIVEN,
        max_retries: Optional[int] = None,
        default_headers: Optional[Mapping[str, str]] = None,
    ) -> Client:
        """A copy with other settings that shares this client's connection pool:
        `client.with_options(timeout=600).jobs.wait(job.id)`."""
        return Client(
            base_url=self.base_url,
            api_key=self.api_key,
            timeout=self.timeout if timeout is NOT_GIVEN else timeout,
            max_retries=self.max_retries if max_retries is None else max_retries,
            default_headers={**self.default_headers, **(default_headers or {})},
            http_client=self._http,
        )


class AsyncClient(AsyncAPIClient):
    """The Humanline API for asyncio: `async with AsyncClient() as client:`;
    the same resources as Client, with awaitable methods and `async for` listings."""

    files: AsyncFiles
    jobs: AsyncJobs
    evaluations: AsyncEvaluations
    reports: AsyncReports

    def __init__(
        self,
        *,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: TimeoutTypes = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        default_headers: Optional[Mapping[str, str]] = None,
        http_client: Optional[httpx.AsyncClient] = None,
    ) -> None:
        super().__init__(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            default_headers=default_headers,
            http_client=http_client,
        )
        self.files = AsyncFiles(self)
        self.jobs = AsyncJobs(self)
        self.evaluations = AsyncEvaluations(self)
        self.reports = AsyncReports(self)

    def with_options(
        self,
        *,
        timeout: Any = NOT_GIVEN,
        max_retries: Optional[int] = None,
        default_headers: Optional[Mapping[str, str]] = None,
    ) -> AsyncClient:
        return AsyncClient(
            base_url=self.base_url,
            api_key=self.api_key,
            timeout=self.timeout if timeout is NOT_GIVEN else timeout,
            max_retries=self.max_retries if max_retries is None else max_retries,
            default_headers={**self.default_headers, **(default_headers or {})},
            http_client=self._http,
        )
