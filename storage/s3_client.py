"""The boto3 side of the S3 store: one process-wide session to build clients from, and how a
boto3/botocore error is classified (missing object, transient, anything else)."""

from __future__ import annotations

import threading
from typing import Any

import boto3
import boto3.exceptions
import boto3.session
import botocore.exceptions

NOT_FOUND_CODES = {"404", "NoSuchKey", "NotFound"}
_TRANSIENT_CODES = {
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "Throttling",
    "ThrottlingException",
}
TRANSIENT_EXC: tuple[type[BaseException], ...] = (
    botocore.exceptions.ConnectionError,  # refused, DNS, connect timeout
    botocore.exceptions.HTTPClientError,  # closed mid-request, read timeout, streaming error
    botocore.exceptions.IncompleteReadError,
    boto3.exceptions.RetriesExceededError,  # s3transfer gave up on a download
)


_SESSION_LOCK = threading.Lock()
_SESSION: boto3.session.Session | None = None


def new_client(**kwargs: Any) -> Any:
    """A client from one process-wide boto3 session: the session caches the parsed S3 service
    model, making each further client ~10x cheaper to build. Building clients from one session
    is not thread-safe, hence the lock; the clients themselves are."""
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            _SESSION = boto3.session.Session()
        return _SESSION.client("s3", **kwargs)


def client_error_code(exc: BaseException) -> tuple[str, int]:
    if isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return str(err.get("Code", "")), int(status or 0)
    return "", 0


def root_cause(exc: BaseException) -> BaseException:
    """boto3 wraps upload failures in S3UploadFailedError; classify on what it wraps."""
    if isinstance(exc, boto3.exceptions.S3UploadFailedError) and exc.__cause__ is not None:
        return exc.__cause__
    return exc


def is_transient(exc: BaseException) -> bool:
    exc = root_cause(exc)
    if isinstance(exc, TRANSIENT_EXC):
        return True
    code, status = client_error_code(exc)
    return status >= 500 or code in _TRANSIENT_CODES
