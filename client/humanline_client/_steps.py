"""One request layer for `Client` and `AsyncClient`.

Every call of the SDK is written once, as a generator of *steps*: it yields what it needs
done (send this request, sleep, read or save a body, call the API) and receives each result
(or has each error thrown into it). `SyncAPIClient._run` performs the steps with blocking
I/O, `AsyncAPIClient._run` awaits them; retries, redirects, paging, polling and downloads
are therefore decided in one place, and the two clients cannot drift apart.

Rules for a steps generator: it never yields inside `finally` (a generator closed early may
not yield); responses it opens are closed by the driver when the call ends, whatever happens.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import anyio
import httpx
from typing_extensions import Protocol

R = TypeVar("R")
# A call written once: yields actions, receives their results, returns R.
Steps = Generator[Any, Any, R]


class SyncDriver(Protocol):
    """What an action needs of the client that performs it blocking (the bottom of the SDK:
    _base_client.SyncAPIClient is one, and this module imports none of the SDK)."""

    _http: httpx.Client

    def _sleep(self, seconds: float) -> None: ...


class AsyncDriver(Protocol):
    """What an action needs of the client that awaits it (_base_client.AsyncAPIClient)."""

    _http: httpx.AsyncClient

    async def _sleep(self, seconds: float) -> None: ...


class Action:
    """Something a steps generator needs done; `sync` and `aio` do it either way."""

    def sync(self, client: SyncDriver) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    async def aio(self, client: AsyncDriver) -> Any:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass
class Send(Action):
    """Send one prepared request (no redirects followed); the response, body read unless
    `stream`."""

    request: httpx.Request
    stream: bool = False

    def sync(self, client: SyncDriver) -> httpx.Response:
        return client._http.send(self.request, stream=self.stream, follow_redirects=False)

    async def aio(self, client: AsyncDriver) -> httpx.Response:
        return await client._http.send(self.request, stream=self.stream, follow_redirects=False)


@dataclass
class Sleep(Action):
    seconds: float

    def sync(self, client: SyncDriver) -> None:
        client._sleep(self.seconds)

    async def aio(self, client: AsyncDriver) -> None:
        await client._sleep(self.seconds)


@dataclass
class Read(Action):
    """Read (the rest of) a streamed body: its bytes."""

    response: httpx.Response

    def sync(self, client: SyncDriver) -> bytes:
        return self.response.read()

    async def aio(self, client: AsyncDriver) -> bytes:
        return await self.response.aread()


@dataclass
class Close(Action):
    response: httpx.Response

    def sync(self, client: SyncDriver) -> None:
        self.response.close()

    async def aio(self, client: AsyncDriver) -> None:
        await self.response.aclose()


@dataclass
class Save(Action):
    """Stream a body into `path` (the caller renames it when complete); the bytes written."""

    response: httpx.Response
    path: Path

    def sync(self, client: SyncDriver) -> int:
        with open(self.path, "wb") as fh:
            fh.writelines(self.response.iter_bytes())
        return os.path.getsize(self.path)

    async def aio(self, client: AsyncDriver) -> int:
        async with await anyio.open_file(self.path, "wb") as fh:
            async for chunk in self.response.aiter_bytes():
                await fh.write(chunk)
        return os.path.getsize(self.path)


@dataclass
class Lines(Action):
    """An iterator over a streamed body's lines (read one at a time with NextLine)."""

    response: httpx.Response

    def sync(self, client: SyncDriver) -> Iterator[str]:
        return self.response.iter_lines()

    async def aio(self, client: AsyncDriver) -> AsyncIterator[str]:
        return self.response.aiter_lines()


@dataclass
class NextLine(Action):
    """The next line of a Lines iterator, or None at the end of the body."""

    lines: Any

    def sync(self, client: SyncDriver) -> Optional[str]:
        return next(self.lines, None)

    async def aio(self, client: AsyncDriver) -> Optional[str]:
        try:
            line: str = await self.lines.__anext__()
        except StopAsyncIteration:
            return None
        return line


@dataclass
class Callback(Action):
    """Call a user's callback with `arg`; on the async side a coroutine function is awaited."""

    fn: Callable[[Any], Any]
    arg: Any

    def sync(self, client: SyncDriver) -> Any:
        return self.fn(self.arg)

    async def aio(self, client: AsyncDriver) -> Any:
        result = self.fn(self.arg)
        return await result if inspect.isawaitable(result) else result


@dataclass
class Emit:
    """Not an action: a value handed to the caller of an iterating driver (a stream's
    events); the generator resumes with None when the caller asks for the next one."""

    value: Any


class Machine:
    """Runs a steps generator: iterate it for the actions, report each outcome with `done`
    or `failed`; `result` is what the generator returned. Remembers every response an
    action produced so that the driver can close what is left open."""

    def __init__(self, steps: Steps[Any]) -> None:
        self._steps = steps
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self.result: Any = None
        self._opened: list[httpx.Response] = []

    def __iter__(self) -> Iterator[Any]:
        while True:
            value, error = self._value, self._error
            self._value = self._error = None
            try:
                if error is not None:
                    action = self._steps.throw(error)
                else:
                    action = self._steps.send(value)
            except StopIteration as stop:
                self.result = stop.value
                return
            yield action

    def done(self, value: Any) -> None:
        if isinstance(value, httpx.Response):
            self._opened.append(value)
        self._value = value

    def failed(self, error: BaseException) -> None:
        self._error = error

    def settle(self, outcome: tuple[Any, Optional[BaseException]]) -> None:
        """(value, None) or (None, error): the outcome of the last action."""
        value, error = outcome
        if error is not None:
            self.failed(error)
        else:
            self.done(value)

    def leftovers(self) -> list[httpx.Response]:
        """Responses to close now that the call is over (not the one it returns)."""
        return [r for r in self._opened if r is not self.result and not r.is_closed]
