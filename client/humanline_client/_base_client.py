"""HTTP plumbing shared by `Client` and `AsyncClient`: request building, retries, error
mapping, JSON parsing, downloads.

Retries (DESIGN.md §7, openai-python's rules, adapted to this API):

- connection errors and timeouts, 408, 429 and 5xx (but 501) are retried with exponential
  backoff (0.5 s, 1 s, 2 s ... capped at 8 s, minus up to 25 % jitter), or after the server's
  `Retry-After` / `retry-after-ms` when it gives one of at most 60 s;
- 409 is retried only when the server sends `Retry-After`: this API's 409s (cancel a finished
  job, delete a file in use, an Idempotency-Key reused with another body) are final answers,
  and repeating them cannot change the outcome;
- an `x-should-retry: true|false` header overrides all of the above;
- every POST carries an `Idempotency-Key`, generated once per call and reused by each of its
  retries, so a create whose response was lost is replayed by the server, not duplicated.
  That is what makes retrying POSTs after a timeout or a dropped connection safe.
"""

from __future__ import annotations

import email.utils
import logging
import os
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar, Union

import anyio
import httpx

from ._exceptions import (
    APIConnectionError,
    APITimeoutError,
    HumanlineError,
    make_status_error,
)
from ._version import __version__

log = logging.getLogger("humanline_client")

M = TypeVar("M")

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
DEFAULT_MAX_RETRIES = 2
INITIAL_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 8.0
MAX_RETRY_AFTER = 60.0

TimeoutTypes = Union[float, httpx.Timeout, None]


class _NotGiven:
    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Any = _NotGiven()

_RETRYABLE_TRANSPORT = (httpx.NetworkError, httpx.RemoteProtocolError)


@dataclass
class RequestOptions:
    method: str
    path: str
    params: Optional[Mapping[str, Any]] = None
    json: Any = None
    data: Optional[Mapping[str, Any]] = None
    # Multipart files are rebuilt for each attempt (a file object is consumed by a send).
    files: Optional[Callable[[], Mapping[str, Any]]] = None
    headers: dict[str, str] = field(default_factory=dict)
    idempotency_key: Optional[str] = None
    timeout: Any = NOT_GIVEN
    max_retries: Optional[int] = None
    stream: bool = False


def new_idempotency_key() -> str:
    return f"hl-{uuid.uuid4().hex}"


def _retry_after(headers: httpx.Headers) -> Optional[float]:
    """Seconds the server asks us to wait (retry-after-ms, or Retry-After seconds or date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return float(raw_ms) / 1000
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        pass
    parsed = email.utils.parsedate_tz(raw)
    if parsed is None:
        return None
    return email.utils.mktime_tz(parsed) - time.time()


def should_retry(response: httpx.Response) -> bool:
    override = response.headers.get("x-should-retry", "").lower()
    if override == "true":
        return True
    if override == "false":
        return False
    code = response.status_code
    if code == 409:
        return "retry-after" in response.headers or "retry-after-ms" in response.headers
    if code in (408, 429):
        return True
    return code >= 500 and code != 501


class BaseClient:
    """Configuration and the pieces of a call that do not depend on sync/async."""

    initial_retry_delay: float = INITIAL_RETRY_DELAY
    max_retry_delay: float = MAX_RETRY_DELAY

    def __init__(
        self,
        *,
        base_url: Optional[str],
        api_key: Optional[str],
        timeout: TimeoutTypes,
        max_retries: int,
        default_headers: Optional[Mapping[str, str]],
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

    def _build_request(
        self,
        http: Union[httpx.Client, httpx.AsyncClient],
        opts: RequestOptions,
        idem: Optional[str],
    ) -> httpx.Request:
        timeout = self.timeout if opts.timeout is NOT_GIVEN else opts.timeout
        if isinstance(timeout, (int, float)):
            timeout = httpx.Timeout(timeout)
        params = {k: v for k, v in (opts.params or {}).items() if v is not None}
        return http.build_request(
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
        obj = cast_to.model_validate(response.json())  # type: ignore[attr-defined]
        obj._request_id = response.headers.get("x-request-id")  # type: ignore[attr-defined]
        return obj


def _part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


class SyncAPIClient(BaseClient):
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
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(timeout=self.timeout, follow_redirects=False)

    def close(self) -> None:
        """Close the connection pool (not a pool passed in as http_client)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def request(self, opts: RequestOptions) -> httpx.Response:
        """Send with retries; returns a response with status < 400 or raises. With
        opts.stream the body is not read yet: close the response when done."""
        idem = self._idempotency_key(opts)
        max_retries = self._max_retries(opts)
        retries_taken = 0
        while True:
            request = self._build_request(self._http, opts, idem)
            left = max_retries - retries_taken
            try:
                response = self._http.send(request, stream=opts.stream, follow_redirects=False)
            except (httpx.TimeoutException, *_RETRYABLE_TRANSPORT) as exc:
                if left > 0:
                    delay = self._retry_delay(retries_taken, None)
                    self._log_retry(request, type(exc).__name__, delay, left - 1)
                    self._sleep(delay)
                    retries_taken += 1
                    continue
                raise self._transport_error(exc, request) from exc
            except httpx.HTTPError as exc:  # unsupported protocol, proxy errors: not transient
                raise self._transport_error(exc, request) from exc
            if response.status_code < 400:
                return response
            if left > 0 and should_retry(response):
                delay = self._retry_delay(retries_taken, response)
                response.close()
                self._log_retry(request, str(response.status_code), delay, left - 1)
                self._sleep(delay)
                retries_taken += 1
                continue
            if opts.stream:
                response.read()
                response.close()
            raise make_status_error(response)

    def _call(self, cast_to: type[M], opts: RequestOptions) -> M:
        return self._parse(self.request(opts), cast_to)

    def _get(self, path: str, cast_to: type[M], *, params: Optional[Mapping[str, Any]] = None) -> M:
        return self._call(cast_to, RequestOptions("GET", path, params=params))

    def _download(self, opts: RequestOptions, to: Union[str, os.PathLike[str], None]):
        """GET a body: bytes in memory, or streamed to `to` (via `to.part`, renamed when
        complete) and its Path returned. A 3xx is followed without our headers (a presigned
        object-store URL must not see the API key). A body cut off midway is fetched again
        while retries remain."""
        max_retries = self._max_retries(opts)
        retries_taken = 0
        while True:
            response = self.request(
                replace(opts, stream=True, max_retries=max_retries - retries_taken)
            )
            try:
                if response.is_redirect:
                    location = response.headers["location"]
                    response.close()
                    redirect = self._http.build_request("GET", response.url.join(location))
                    response = self._http.send(redirect, stream=True)
                    if response.status_code >= 400:
                        response.read()
                        raise make_status_error(response)
                if to is None:
                    return response.read()
                dest = Path(to)
                part = _part_path(dest)
                with open(part, "wb") as fh:
                    fh.writelines(response.iter_bytes())
                os.replace(part, dest)
                return dest
            except (httpx.TimeoutException, *_RETRYABLE_TRANSPORT) as exc:
                if to is not None:
                    _part_path(Path(to)).unlink(missing_ok=True)
                if retries_taken < max_retries:
                    retries_taken += 1
                    self._sleep(self._retry_delay(retries_taken - 1, None))
                    continue
                raise self._transport_error(exc, response.request) from exc
            finally:
                response.close()


class AsyncAPIClient(BaseClient):
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
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=self.timeout, follow_redirects=False)

    async def close(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)

    async def request(self, opts: RequestOptions) -> httpx.Response:
        idem = self._idempotency_key(opts)
        max_retries = self._max_retries(opts)
        retries_taken = 0
        while True:
            request = self._build_request(self._http, opts, idem)
            left = max_retries - retries_taken
            try:
                response = await self._http.send(
                    request, stream=opts.stream, follow_redirects=False
                )
            except (httpx.TimeoutException, *_RETRYABLE_TRANSPORT) as exc:
                if left > 0:
                    delay = self._retry_delay(retries_taken, None)
                    self._log_retry(request, type(exc).__name__, delay, left - 1)
                    await self._sleep(delay)
                    retries_taken += 1
                    continue
                raise self._transport_error(exc, request) from exc
            except httpx.HTTPError as exc:
                raise self._transport_error(exc, request) from exc
            if response.status_code < 400:
                return response
            if left > 0 and should_retry(response):
                delay = self._retry_delay(retries_taken, response)
                await response.aclose()
                self._log_retry(request, str(response.status_code), delay, left - 1)
                await self._sleep(delay)
                retries_taken += 1
                continue
            if opts.stream:
                await response.aread()
                await response.aclose()
            raise make_status_error(response)

    async def _call(self, cast_to: type[M], opts: RequestOptions) -> M:
        return self._parse(await self.request(opts), cast_to)

    async def _get(
        self, path: str, cast_to: type[M], *, params: Optional[Mapping[str, Any]] = None
    ) -> M:
        return await self._call(cast_to, RequestOptions("GET", path, params=params))

    async def _download(self, opts: RequestOptions, to: Union[str, os.PathLike[str], None]):
        max_retries = self._max_retries(opts)
        retries_taken = 0
        while True:
            response = await self.request(
                replace(opts, stream=True, max_retries=max_retries - retries_taken)
            )
            try:
                if response.is_redirect:
                    location = response.headers["location"]
                    await response.aclose()
                    redirect = self._http.build_request("GET", response.url.join(location))
                    response = await self._http.send(redirect, stream=True)
                    if response.status_code >= 400:
                        await response.aread()
                        raise make_status_error(response)
                if to is None:
                    return await response.aread()
                dest = Path(to)
                part = _part_path(dest)
                async with await anyio.open_file(part, "wb") as fh:
                    async for chunk in response.aiter_bytes():
                        await fh.write(chunk)
                os.replace(part, dest)
                return dest
            except (httpx.TimeoutException, *_RETRYABLE_TRANSPORT) as exc:
                if to is not None:
                    _part_path(Path(to)).unlink(missing_ok=True)
                if retries_taken < max_retries:
                    retries_taken += 1
                    await self._sleep(self._retry_delay(retries_taken - 1, None))
                    continue
                raise self._transport_error(exc, response.request) from exc
            finally:
                await response.aclose()
