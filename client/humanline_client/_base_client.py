"""HTTP plumbing shared by `Client` and `AsyncClient`: configuration, request building,
error mapping, JSON parsing, and the steps of a request with retries (see _retries) and of a
download, performed by SyncAPIClient or AsyncAPIClient (see _steps).

The SDK's order, each module importing only those before it: _steps (the step machine) →
_base_client (this) → _resource (the resource base) → _methods → resources/* → _client
(`Client`: this plus the resources) → the package.
"""

from __future__ import annotations

import logging
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import (
    Any,
    Callable,
    ClassVar,
    Generic,
    Optional,
    TypeVar,
    Union,
    cast,
)

import anyio
import httpx
from typing_extensions import Self

from ._exceptions import (
    APIConnectionError,
    APITimeoutError,
    HumanlineError,
    make_status_error,
)
from ._retries import (
    _RETRYABLE_TRANSPORT,
    DEFAULT_BASE_URL,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT,
    INITIAL_RETRY_DELAY,
    MAX_RETRY_AFTER,
    MAX_RETRY_DELAY,
    NOT_GIVEN,
    RequestOptions,
    TimeoutTypes,
    _retry_after,
    new_idempotency_key,
    should_retry,
)
from ._steps import Close, Emit, Machine, Read, Save, Send, Sleep, Steps
from ._version import __version__

log = logging.getLogger("humanline_client")

M = TypeVar("M")
R = TypeVar("R")
H = TypeVar("H", httpx.Client, httpx.AsyncClient)
PathLike = Union[str, "os.PathLike[str]"]


class BaseClient(Generic[H]):
    """Configuration, the resource namespaces, and every step of a call (requests with
    retries, downloads): what does not depend on sync/async. Subclasses only perform the
    steps (`_run`) with their HTTP pool `H`."""

    initial_retry_delay: float = INITIAL_RETRY_DELAY
    max_retry_delay: float = MAX_RETRY_DELAY
    # (attribute, resource class) pairs made with each client: `client.files = Files(client)`,
    # ... (set by _client.with_resources from Client's annotations)
    _resources: ClassVar[tuple[tuple[str, Callable[[Any], Any]], ...]] = ()

    def __init__(
        self,
        *,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: TimeoutTypes = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        default_headers: Optional[Mapping[str, str]] = None,
        http_client: Optional[H] = None,
    ) -> None:
        base_url = base_url or os.environ.get("HUMANLINE_BASE_URL") or DEFAULT_BASE_URL
        api_key = api_key or os.environ.get("HUMANLINE_API_KEY")
        if not api_key:
            raise HumanlineError(
                "no API key: pass api_key=... or set HUMANLINE_API_KEY "
                "(an admin creates one with `humanline-server create-key TEAM`)"
            )
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        base_url = base_url.rstrip("/")
        base_url = base_url.removesuffix("/v1")
        self.base_url = base_url
        self.api_key = api_key
        self.timeout = (
            timeout
            if isinstance(timeout, httpx.Timeout) or timeout is None
            else (httpx.Timeout(timeout))
        )
        self.max_retries = max_retries
        self.default_headers: dict[str, str] = dict(default_headers or {})
        self._owns_http = http_client is None
        self._http: H = http_client if http_client is not None else self._new_http()
        for name, resource in self._resources:
            setattr(self, name, resource(self))

    def _new_http(self) -> H:  # pragma: no cover - interface
        raise NotImplementedError

    def with_options(
        self,
        *,
        timeout: Any = NOT_GIVEN,
        max_retries: Optional[int] = None,
        default_headers: Optional[Mapping[str, str]] = None,
    ) -> Self:
        """A copy with other settings that shares this client's connection pool:
        `client.with_options(timeout=600).jobs.wait(job.id)`."""
        return type(self)(
            base_url=self.base_url,
            api_key=self.api_key,
            timeout=self.timeout if timeout is NOT_GIVEN else timeout,
            max_retries=self.max_retries if max_retries is None else max_retries,
            default_headers={**self.default_headers, **(default_headers or {})},
            http_client=self._http,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    # --- requests ------------------------------------------------------------------------

    def _headers(self, opts: RequestOptions, idempotency_key: Optional[str]) -> dict[str, str]:
        headers = {
            "Accept": "application/json",
            "User-Agent": f"humanline-python/{__version__}",
            "Authorization": f"Bearer {self.api_key}",
            # Our own id for each attempt: the server adopts it, so an attempt that got no
            # response (timeout, reset) can still be found in the service's logs.
            "X-Request-ID": uuid.uuid4().hex,
            **self.default_headers,
            **opts.headers,
        }
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        return headers

    def _build_request(self, opts: RequestOptions, idem: Optional[str]) -> httpx.Request:
        timeout = self.timeout if opts.timeout is NOT_GIVEN else opts.timeout
        if isinstance(timeout, (int, float)):
            timeout = httpx.Timeout(timeout)
        params = {k: v for k, v in (opts.params or {}).items() if v is not None}
        return self._http.build_request(
            opts.method,
            self.base_url + opts.path,
            params=params,
            json=opts.json,
            data=opts.data,
            files=opts.files() if opts.files is not None else None,
            headers=self._headers(opts, idem),
            timeout=timeout,
        )

    @staticmethod
    def _idempotency_key(opts: RequestOptions) -> Optional[str]:
        if opts.idempotency_key is not None:
            return opts.idempotency_key
        return new_idempotency_key() if opts.method.upper() == "POST" else None

    def _max_retries(self, opts: RequestOptions) -> int:
        return self.max_retries if opts.max_retries is None else opts.max_retries

    def _retry_delay(self, retries_taken: int, response: Optional[httpx.Response]) -> float:
        if response is not None:
            asked = _retry_after(response.headers)
            if asked is not None and 0 <= asked <= MAX_RETRY_AFTER:
                return asked
        delay = min(self.initial_retry_delay * 2.0**retries_taken, self.max_retry_delay)
        return delay * (1 - 0.25 * random.random())

    @staticmethod
    def _transport_error(exc: Exception, request: httpx.Request) -> APIConnectionError:
        request_id = request.headers.get("x-request-id")
        if isinstance(exc, httpx.TimeoutException):
            return APITimeoutError(
                f"{request.method} {request.url.path} timed out ({type(exc).__name__})",
                request=request,
                request_id=request_id,
            )
        return APIConnectionError(
            f"could not reach {request.url.scheme}://{request.url.netloc.decode()}: "
            f"{exc or type(exc).__name__}",
            request=request,
            request_id=request_id,
        )

    @staticmethod
    def _log_retry(request: httpx.Request, why: str, delay: float, left: int) -> None:
        log.info(
            "retrying %s %s in %.2fs after %s (%d retries left)",
            request.method,
            request.url.path,
            delay,
            why,
            left,
        )

    @staticmethod
    def _parse(response: httpx.Response, cast_to: type[M]) -> M:
        obj: Any = cast_to.model_validate(response.json())  # type: ignore[attr-defined]
        obj._request_id = response.headers.get("x-request-id")
        return cast(M, obj)

    # --- the steps of a call (performed by SyncAPIClient._run / AsyncAPIClient._run) ------

    def _request_steps(self, opts: RequestOptions) -> Steps[httpx.Response]:
        """Send with retries; returns a response with status < 400 or raises. With
        opts.stream the body is not read yet: close the response when done."""
        idem = self._idempotency_key(opts)
        max_retries = self._max_retries(opts)
        retries_taken = 0
        while True:
            request = self._build_request(opts, idem)
            left = max_retries - retries_taken
            try:
                response: httpx.Response = yield Send(request, opts.stream)
            except (httpx.TimeoutException, *_RETRYABLE_TRANSPORT) as exc:
                if left <= 0:
                    raise self._transport_error(exc, request) from exc
                delay = self._retry_delay(retries_taken, None)
                self._log_retry(request, type(exc).__name__, delay, left - 1)
            except httpx.HTTPError as exc:  # unsupported protocol, proxy errors: not transient
                raise self._transport_error(exc, request) from exc
            else:
                if response.status_code < 400:
                    return response
                if left <= 0 or not should_retry(response):
                    if opts.stream:
                        yield Read(response)
                    raise make_status_error(response)
                delay = self._retry_delay(retries_taken, response)
                yield Close(response)
                self._log_retry(request, str(response.status_code), delay, left - 1)
            yield Sleep(delay)
            retries_taken += 1

    def _call_steps(self, cast_to: type[M], opts: RequestOptions) -> Steps[M]:
        return self._parse((yield from self._request_steps(opts)), cast_to)

    def _download_steps(
        self, opts: RequestOptions, to: Optional[PathLike]
    ) -> Steps[Union[bytes, Path]]:
        """GET a body: bytes in memory, or streamed to `to` (via `to.part`, renamed when
        complete) and its Path returned. A 3xx is followed without our headers (a presigned
        object-store URL must not see the API key). A body cut off midway is fetched again
        while retries remain."""
        max_retries = self._max_retries(opts)
        retries_taken = 0
        while True:
            attempt = replace(opts, stream=True, max_retries=max_retries - retries_taken)
            response = yield from self._request_steps(attempt)
            try:
                if response.is_redirect:
                    location = response.headers["location"]
                    yield Close(response)
                    redirect = self._http.build_request("GET", response.url.join(location))
                    response = yield Send(redirect, True)
                    if response.status_code >= 400:
                        yield Read(response)
                        raise make_status_error(response)
                if to is None:
                    body: bytes = yield Read(response)
                    return body
                dest = Path(to)
                yield Save(response, _part_path(dest))
                os.replace(_part_path(dest), dest)
                return dest
            except (httpx.TimeoutException, *_RETRYABLE_TRANSPORT) as exc:
                if to is not None:
                    _part_path(Path(to)).unlink(missing_ok=True)
                if retries_taken >= max_retries:
                    raise self._transport_error(exc, response.request) from exc
            yield Close(response)
            retries_taken += 1
            yield Sleep(self._retry_delay(retries_taken - 1, None))


def _part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


class SyncAPIClient(BaseClient[httpx.Client]):
    def _new_http(self) -> httpx.Client:
        return httpx.Client(timeout=self.timeout, follow_redirects=False)

    def close(self) -> None:
        """Close the connection pool (not a pool passed in as http_client)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _drive(self, machine: Machine) -> Iterator[Any]:
        """Perform a call's steps, blocking; yields what the steps emit (stream events)."""
        try:
            for action in machine:
                if isinstance(action, Emit):
                    yield action.value
                    continue
                try:
                    machine.done(action.sync(self))
                except Exception as exc:  # noqa: BLE001 - thrown into the steps
                    machine.failed(exc)
        finally:
            for response in machine.leftovers():
                response.close()

    def _run(self, steps: Steps[R]) -> R:
        machine = Machine(steps)
        for value in self._drive(machine):
            raise TypeError(f"a call emitted {value!r}")  # pragma: no cover - a bug
        return machine.result  # type: ignore[no-any-return]

    def request(self, opts: RequestOptions) -> httpx.Response:
        """Send with retries; returns a response with status < 400 or raises. With
        opts.stream the body is not read yet: close the response when done."""
        return self._run(self._request_steps(opts))

    def _call(self, cast_to: type[M], opts: RequestOptions) -> M:
        return self._run(self._call_steps(cast_to, opts))

    def _get(self, path: str, cast_to: type[M], *, params: Optional[Mapping[str, Any]] = None) -> M:
        return self._call(cast_to, RequestOptions("GET", path, params=params))

    def _download(self, opts: RequestOptions, to: Optional[PathLike]) -> Any:
        return self._run(self._download_steps(opts, to))


class AsyncAPIClient(BaseClient[httpx.AsyncClient]):
    def _new_http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self.timeout, follow_redirects=False)

    async def close(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)

    async def _drive(self, machine: Machine) -> AsyncIterator[Any]:
        """Perform a call's steps, awaiting each; yields what the steps emit."""
        try:
            for action in machine:
                if isinstance(action, Emit):
                    yield action.value
                else:
                    outcome = await _outcome(action.aio(self))
                    machine.settle(outcome)
        finally:
            for response in machine.leftovers():
                await response.aclose()

    async def _run(self, steps: Steps[R]) -> R:
        machine = Machine(steps)
        async for value in self._drive(machine):
            raise TypeError(f"a call emitted {value!r}")  # pragma: no cover - a bug
        return machine.result  # type: ignore[no-any-return]

    async def request(self, opts: RequestOptions) -> httpx.Response:
        return await self._run(self._request_steps(opts))

    async def _call(self, cast_to: type[M], opts: RequestOptions) -> M:
        return await self._run(self._call_steps(cast_to, opts))

    async def _get(
        self, path: str, cast_to: type[M], *, params: Optional[Mapping[str, Any]] = None
    ) -> M:
        return await self._call(cast_to, RequestOptions("GET", path, params=params))

    async def _download(self, opts: RequestOptions, to: Optional[PathLike]) -> Any:
        return await self._run(self._download_steps(opts, to))


async def _outcome(awaitable: Awaitable[Any]) -> tuple[Any, Optional[Exception]]:
    try:
        return await awaitable, None
    except Exception as exc:  # noqa: BLE001 - thrown into the steps
        return None, exc
