"""The boto3 side of the S3 store: one process-wide session to build clients from, how a
boto3/botocore error is classified (missing object, transient, anything else), and the paged
listings the store reads (objects, unfinished multipart uploads)."""

from __future__ import annotations

import threading
from typing import Any

import boto3
import boto3.exceptions
import boto3.session
import botocore.exceptions

from storage.base import ObjectNotFound, StorageError, StorageUnavailableError

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
BOTO_ERRORS: tuple[type[Exception], ...] = (
    botocore.exceptions.BotoCoreError,
    botocore.exceptions.ClientError,
    boto3.exceptions.Boto3Error,
)
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


def storage_error(exc: BaseException, op: str, key: str, bucket: str, where: str) -> StorageError:
    """What the store raises for a failed S3 call: ObjectNotFound, StorageUnavailableError
    (transient: the endpoint `where` is down or overloaded) or StorageError (anything else),
    naming the operation, the key and the bucket."""
    cause = root_cause(exc)
    code, status = client_error_code(cause)
    if code in NOT_FOUND_CODES:
        return ObjectNotFound(key)
    what = f"S3 {op} of {key!r} in bucket {bucket!r} failed"
    if is_transient(cause):
        return StorageUnavailableError(
            f"{what}: endpoint {where} unavailable ({type(cause).__name__}: {cause})"
        )
    detail = f"{code} (HTTP {status})" if code else f"{type(cause).__name__}: {cause}"
    return StorageError(f"{what}: {detail}")


def list_objects(client: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    """Every object under `prefix`, as list_objects_v2 describes it (Key, Size, LastModified)."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [obj for page in pages for obj in page.get("Contents", [])]


def unfinished_uploads(client: Any, bucket: str, prefix: str) -> list[tuple[str, str, int, float]]:
    """(key, upload id, bytes of its parts, time of its newest part or of its start) of every
    multipart upload under `prefix` that was neither completed nor aborted."""
    out = []
    pages = client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix)
    for up in (u for page in pages for u in page.get("Uploads", [])):
        size, modified = 0, up["Initiated"].timestamp()
        for part_page in client.get_paginator("list_parts").paginate(
            Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"]
        ):
            for part in part_page.get("Parts", []):
                size += int(part["Size"])
                modified = max(modified, part["LastModified"].timestamp())
        out.append((up["Key"], up["UploadId"], size, modified))
    return out
