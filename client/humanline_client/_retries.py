"""Request options and the retry policy of both clients.

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
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import httpx

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
