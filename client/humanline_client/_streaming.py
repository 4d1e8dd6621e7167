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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import httpx
from pydantic import ValidationError
from typing_extensions import Self

from ._exceptions import APIConnectionError, JobWaitTimeout
from ._retries import _RETRYABLE_TRANSPORT, RequestOptions
from ._sse import SSEDecoder
from ._steps import Close, Emit, Lines, Machine, NextLine, Sleep, Steps
from .types import JobEvent

if TYPE_CHECKING:
    from ._base_client import AsyncAPIClient, SyncAPIClient

log = logging.getLogger("humanline_client")

DEFAULT_MAX_RECONNECTS = 10
HEALTHY_SECONDS = 5.0  # a connection that lasted this long was not a failure


@dataclass
class _StreamState:
    """Where a stream is: the last seq seen, the reconnect streak, the server's retry hint,
    and the job's final status once `event: end` came."""

    client: Any
    job_id: str
    path: str
    after: int
    max_reconnects: int
    deadline: Optional[float]
    last_seq: int = 0
    failures: int = 0
    reconnects: int = 0
    retry_hint: Optional[float] = None
    status: Optional[str] = None
    end: Optional[dict[str, Any]] = None

    def __post_init__(self) -> None:
        self.last_seq = self.after

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
        return float(delay)

    def steps(self) -> Steps[None]:
        """Connect, emit each new event, reconnect after a drop, until `event: end`."""
        while True:
            opened_at, seen = time.monotonic(), self.last_seq
            response = None
            try:
                response = yield from self.client._request_steps(self.options())
                lines = yield Lines(response)
                decoder = SSEDecoder()
                while (line := (yield NextLine(lines))) is not None:
                    event = self.handle(decoder, line)
                    if event is not None:
                        yield Emit(event)
                    elif self.end is not None:
                        return
                why = "the stream closed before the job ended"
            except (httpx.TimeoutException, *_RETRYABLE_TRANSPORT) as exc:
                why = type(exc).__name__
            except APIConnectionError as exc:  # the request already spent its own retries
                why = str(exc)
            if response is not None:
                yield Close(response)
            healthy = self.last_seq > seen or time.monotonic() - opened_at >= HEALTHY_SECONDS
            yield Sleep(self.next_delay(why, healthy))


class _Stream:
    """What both streams share: their state and its read-only view."""

    def __init__(
        self,
        client: Any,
        job_id: str,
        path: str,
        *,
        after: int = 0,
        max_reconnects: int = DEFAULT_MAX_RECONNECTS,
        deadline: Optional[float] = None,
    ) -> None:
        self._state = _StreamState(client, job_id, path, after, max_reconnects, deadline)
        self._machine = Machine(self._state.steps())

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


class JobEventStream(_Stream):
    """Iterate a job's events until it finishes; `status` is its final status afterwards.
    Use as a context manager (or call `close()`) when you stop early."""

    def __init__(self, client: SyncAPIClient, job_id: str, path: str, **options: Any) -> None:
        super().__init__(client, job_id, path, **options)
        self._iterator: Iterator[JobEvent] = client._drive(self._machine)

    def __iter__(self) -> Iterator[JobEvent]:
        return self

    def __next__(self) -> JobEvent:
        return next(self._iterator)

    def close(self) -> None:
        self._iterator.close()  # type: ignore[attr-defined]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncJobEventStream(_Stream):
    """`async for event in stream`; see JobEventStream."""

    def __init__(self, client: AsyncAPIClient, job_id: str, path: str, **options: Any) -> None:
        super().__init__(client, job_id, path, **options)
        self._iterator: AsyncIterator[JobEvent] = client._drive(self._machine)

    def __aiter__(self) -> AsyncIterator[JobEvent]:
        return self

    async def __anext__(self) -> JobEvent:
        return await self._iterator.__anext__()

    async def aclose(self) -> None:
        await self._iterator.aclose()  # type: ignore[attr-defined]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
