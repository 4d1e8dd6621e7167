"""Exceptions: one class per HTTP status family, each carrying what the API said.

    HumanlineError
    ├── APIError                      (message, request_id, body)
    │   ├── APIStatusError            (status_code, type, field, errors, response)
    │   │   ├── BadRequestError             400 (and 4xx without a class of their own)
    │   │   │   ├── UnprocessableEntityError   422: the request is well-formed but invalid
    │   │   │   └── RequestTooLargeError       413
    │   │   ├── AuthenticationError         401
    │   │   ├── PermissionDeniedError       403
    │   │   ├── NotFoundError               404
    │   │   ├── ConflictError               409
    │   │   ├── RateLimitError              429
    │   │   └── InternalServerError         5xx
    │   └── APIConnectionError        (no response: refused, reset, DNS, ...)
    │       └── APITimeoutError
    ├── JobWaitTimeout               (jobs.wait gave up; the job goes on)
    └── EvaluationWaitTimeout        (evaluations.wait gave up; the evaluation goes on)

`request_id` is the server's X-Request-ID for the failed attempt; the SDK sends its own id with
every attempt, so even a timeout or a dropped connection names the id to look for in the
service logs.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

import httpx

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "EvaluationWaitTimeout",
    "HumanlineError",
    "InternalServerError",
    "JobWaitTimeout",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestTooLargeError",
    "UnprocessableEntityError",
]


class HumanlineError(Exception):
    """Base class of every exception this SDK raises on purpose."""


class APIError(HumanlineError):
    message: str
    request: Optional[httpx.Request]
    request_id: Optional[str]
    body: Optional[Any]

    def __init__(
        self,
        message: str,
        *,
        request: Optional[httpx.Request] = None,
        request_id: Optional[str] = None,
        body: Optional[Any] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.request = request
        self.request_id = request_id
        self.body = body

    def __str__(self) -> str:
        return (
            self.message
            if not self.request_id
            else f"{self.message} (request id {self.request_id})"
        )


class APIStatusError(APIError):
    """The server answered with a 4xx or 5xx status."""

    status_code: int
    response: httpx.Response
    type: Optional[str]
    field: Optional[str]
    errors: Optional[list[dict[str, Any]]]

    def __init__(
        self,
        message: str,
        *,
        response: httpx.Response,
        body: Optional[Any] = None,
        request_id: Optional[str] = None,
        type: Optional[str] = None,
        field: Optional[str] = None,
        errors: Optional[list[dict[str, Any]]] = None,
    ) -> None:
        super().__init__(message, request=response.request, request_id=request_id, body=body)
        self.response = response
        self.status_code = response.status_code
        self.type = type
        self.field = field
        self.errors = errors

    def __str__(self) -> str:
        where = f" [{self.field}]" if self.field else ""
        text = f"{self.status_code} {self.type or 'error'}{where}: {self.message}"
        if self.errors and len(self.errors) > 1:
            text += f" (+{len(self.errors) - 1} more errors)"
        if self.request_id:
            text += f" (request id {self.request_id})"
        return text


class BadRequestError(APIStatusError):
    """400, and any other 4xx without a class of its own."""


class UnprocessableEntityError(BadRequestError):
    """422: a field failed validation; see `field` and `errors`."""


class RequestTooLargeError(BadRequestError):
    """413: the upload or body is larger than the server accepts."""


class AuthenticationError(APIStatusError):
    """401: missing, invalid or revoked API key."""


class PermissionDeniedError(APIStatusError):
    """403."""


class NotFoundError(APIStatusError):
    """404 (another team's objects are indistinguishable from missing ones)."""


class ConflictError(APIStatusError):
    """409: the object's state forbids this (cancel a finished job, delete a busy file, or an
    Idempotency-Key reused with a different request)."""


class RateLimitError(APIStatusError):
    """429: too many requests, or too many active jobs for the team."""


class InternalServerError(APIStatusError):
    """5xx."""


class APIConnectionError(APIError):
    """No HTTP response: connection refused or reset, DNS failure, protocol error."""

    default_message: ClassVar[str] = "connection error"

    def __init__(
        self,
        message: Optional[str] = None,
        *,
        request: Optional[httpx.Request] = None,
        request_id: Optional[str] = None,
    ) -> None:
        message = self.default_message if message is None else message
        super().__init__(message, request=request, request_id=request_id)


class APITimeoutError(APIConnectionError):
    """The request timed out (connect, read, write or pool timeout)."""

    default_message: ClassVar[str] = "request timed out"


class JobWaitTimeout(HumanlineError, TimeoutError):
    """`jobs.wait(timeout=...)` ran out of time; the job itself keeps going. `job` is its last
    known state."""

    def __init__(self, message: str, *, job: Any = None) -> None:
        super().__init__(message)
        self.job = job


class EvaluationWaitTimeout(HumanlineError, TimeoutError):
    """`evaluations.wait(timeout=...)` ran out of time; the evaluation itself keeps going.
    `evaluation` is its last known state."""

    def __init__(self, message: str, *, evaluation: Any = None) -> None:
        super().__init__(message)
        self.evaluation = evaluation


_BY_STATUS = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: RequestTooLargeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def status_error_class(status_code: int) -> type:
    if status_code in _BY_STATUS:
        return _BY_STATUS[status_code]
    if status_code >= 500:
        return InternalServerError
    if 400 <= status_code < 500:
        return BadRequestError
    return APIStatusError


def make_status_error(response: httpx.Response) -> APIStatusError:
    """Build the exception for an error response (its body must have been read)."""
    body: Any = None
    try:
        body = response.json()
    except ValueError:
        body = response.text or None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        message = str(error.get("message") or response.reason_phrase or "error")
        kind = error.get("type")
        field = error.get("field")
        errors = error.get("errors")
        request_id = error.get("request_id")
    else:
        detail = body.get("detail") if isinstance(body, dict) else None
        message = str(detail or (body if isinstance(body, str) else None) or response.reason_phrase)
        kind = field = errors = request_id = None
    request_id = request_id or response.headers.get("x-request-id")
    cls = status_error_class(response.status_code)
    exc: APIStatusError = cls(
        message,
        response=response,
        body=body,
        request_id=request_id,
        type=kind,
        field=field,
        errors=errors if isinstance(errors, list) else None,
    )
    return exc
