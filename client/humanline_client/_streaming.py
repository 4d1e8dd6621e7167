"""Following a job's event stream (`GET /v1/jobs/{id}/events/stream`, server-sent events).

The server sends one SSE event per job event (`id:` = its seq) and `event: end` once the job
has finished. When the connection drops, times out or closes before `end` (a restart, a proxy
cutting long responses), the stream reconnects with `Last-Event-ID: <last seq>` and the
server resumes after it; events already seen are skipped, so nothing is lost or repeated.
Reconnects back off like retries (capped by the server's `retry:` hint) and give up after
`max_reconnects` consecutive failures without a new event. 4xx answers are raised at once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Optional

import httpx
from pydantic import ValidationError
from typing_extensions import Self

from ._base_client import _RETRYABLE_TRANSPORT, RequestOptions
from ._exceptions import APIConnectionError, JobWaitTimeout
from ._sse import SSEDecoder
from .types import JobEvent

if TYPE_CHECKING:
    from ._base_client import AsyncAPIClient, SyncAPIClient

log = logging.getLogger("humanline_client")

DEFAULT_MAX_RECONNECTS = 10
HEALTHY_SECONDS = 5.0  # a connection that lasted this long was not a failure


class _StreamState:
    def __init__(
        self,
        client: Any,
        job_id: str,
        path: str,
        after: int,
        max_reconnects: int,
        deadline: Optional[float],
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.path = path
        self.after = after
        self.last_seq = after
        self.max_reconnects = max_reconnects
        self.deadline = deadline
        self.failures = 0
        self.retry_hint: Optional[float] = None
        self.status: Optional[str] = None
        self.end: Optional[dict[str, Any]] = None
        self.reconnects = 0

    def options(self) -> RequestOptions:
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self.last_seq:
            headers["Last-Event-ID"] = str(self.last_seq)
        timeout = self.client.timeout or httpx.Timeout(None)
        if self.deadline is not None:
            left = max(0.01, self.deadline - time.monotonic())
            read = left if timeout.read is None else min(timeout.read, left)
            timeout = httpx.Timeout(
                timeout.connect, read=read, write=timeout.write, pool=timeout.pool
            )
        return RequestOptions(
            "GET",
            self.path,
            params={"after": self.after},
            headers=headers,
            timeout=timeout,
            stream=True,
        )

    def handle(self, decoder: SSEDecoder, line: str) -> Optional[JobEvent]:
        """One line in; a new JobEvent out (or None). Sets `end`/`status` on `event: end`."""
        sse = decoder.feed(line)
        if decoder.retry_ms is not None:
            self.retry_hint = decoder.retry_ms / 1000
        if sse is None:
            return None
        if sse.event == "end":
            try:
                self.end = json.loads(sse.data) if sse.data else {}
            except ValueError:
                self.end = {}
            self.status = (self.end or {}).get("status")
            return None
        try:
            event = JobEvent.model_validate_json(sse.data)
        except (ValidationError, ValueError):
            log.warning("skipping an unreadable %r event of job %s", sse.event, self.job_id)
            return None
        if event.seq <= self.last_seq:  # already seen before a reconnect
            return None
        self.last_seq = event.seq
        return event

    def next_delay(self, why: str, healthy: bool) -> float:
        """After a dropped or finished-too-early stream: how long to wait before reconnecting
        (raises when out of time or out of reconnects). `healthy`: the connection delivered
        events or stayed up a while, so this is not a failure streak (a proxy that cuts long
        responses must not end a long wait)."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise JobWaitTimeout(f"job {self.job_id} did not finish in time")
        if healthy:
            self.failures = 0
        self.failures += 1
        if self.failures > self.max_reconnects:
            raise APIConnectionError(
                f"the event stream of job {self.job_id} failed {self.failures} times in a row "
                f"({why})"
            )
        self.reconnects += 1
        delay = self.client._retry_delay(self.failures - 1, None)
        if self.retry_hint is not None:
            delay = min(delay, self.retry_hint)
        if self.deadline is not None:
            delay = min(delay, max(0.0, self.deadline - time.monotonic()))
        log.info("event stream of %s: %s; reconnecting in %.2fs", self.job_id, why, delay)
        return delay


class JobEventStream:
    """Iterate a job's events until it finishes; `status` is its final status afterwards.
    Use as a context manager (or call `close()`) when you stop early."""

    def __init__(
        self,
        client: SyncAPIClient,
        job_id: str,
        path: str,
        *,
        after: int = 0,
        max_reconnects: int = DEFAULT_MAX_RECONNECTS,
        deadline: Optional[float] = None,
    ) -> None:
        self._state = _StreamState(client, job_id, path, after, max_reconnects, deadline)
        self._iterator = self._run()

    @property
    def job_id(self) -> str:
        return self._state.job_id

    @property
    def status(self) -> Optional[str]:
        """The job's final status, once the stream has ended (None before)."""
        return self._state.status

    @property
    def last_seq(self) -> int:
        return self._state.last_seq

    @property
    def reconnects(self) -> int:
        return self._state.reconnects

    def __iter__(self) -> Iterator[JobEvent]:
        return self

    def __next__(self) -> JobEvent:
        return next(self._iterator)

    def close(self) -> None:
        self._iterator.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> Iterator[JobEvent]:
        state = self._state
        client = state.client
        while True:
            opened_at, seen = time.monotonic(), state.last_seq
            try:
                response = client.request(state.options())
                try:
                    decoder = SSEDecoder()
                    for line in response.iter_lines():
                        event = state.handle(decoder, line)
                        if event is not None:
                            yield event
                        elif state.end is not None:
                            return
                finally:
                    response.close()
                why = "the stream closed before the job ended"
            except (httpx.TimeoutException, *_RETRYABLE_TRANSPORT) as exc:
                why = type(exc).__name__
            except APIConnectionError as exc:  # request() already spent its own retries
                why = str(exc)
            healthy = state.last_seq > seen or time.monotonic() - opened_at >= HEALTHY_SECONDS
            client._sleep(state.next_delay(why, healthy))


class AsyncJobEventStream:
    """`async for event in stream`; see JobEventStream."""

    def __init__(
        self,
        client: AsyncAPIClient,
        job_id: str,
        path: str,
        *,
        after: int = 0,
        max_reconnects: int = DEFAULT_MAX_RECONNECTS,
        deadline: Optional[float] = None,
    ) -> None:
        self._state = _StreamState(client, job_id, path, after, max_reconnects, deadline)
        self._iterator = self._run()

    @property
    def job_id(self) -> str:
        return self._state.job_id

    @property
    def status(self) -> Optional[str]:
        return self._state.status

    @property
    def last_seq(self) -> int:
        return self._state.last_seq

    @property
    def reconnects(self) -> int:
        return self._state.reconnects

    def __aiter__(self) -> AsyncIterator[JobEvent]:
        return self

    async def __anext__(self) -> JobEvent:
        return await self._iterator.__anext__()

    async def aclose(self) -> None:
        await self._iterator.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self) -> AsyncIterator[JobEvent]:
        state = self._state
        client = state.client
        while True:
            opened_at, seen = time.monotonic(), state.last_seq
            try:
                response = await client.request(state.options())
                try:
                    decoder = SSEDecoder()
                    async for line in response.aiter_lines():
                        event = state.handle(decoder, line)
                        if event is not None:
                            yield event
                        elif state.end is not None:
                            return
                finally:
                    await response.aclose()
                why = "the stream closed before the job ended"
            except (httpx.TimeoutException, *_RETRYABLE_TRANSPORT) as exc:
                why = type(exc).__name__
            except APIConnectionError as exc:
                why = str(exc)
            healthy = state.last_seq > seen or time.monotonic() - opened_at >= HEALTHY_SECONDS
            await client._sleep(state.next_delay(why, healthy))
