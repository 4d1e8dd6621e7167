"""Object storage for datasets, checkpoints and reports: a local directory or an S3 bucket
behind one interface (`ObjectStore`), chosen by URL with `open_store`.

    open_store("file:///var/lib/humanline/objects")      # LocalStore (absolute path)
    open_store("file://./.humanline/objects")            # LocalStore (relative to the cwd)
    open_store("s3://bucket/some/prefix", endpoint_url=...)  # S3Store (bucket created if missing)

Keys come from `storage.keys` (ids only, never user input); every store re-checks them.
"""

from __future__ import annotations

from typing import Any

from storage.base import (
    COMPLETE_MARKER,
    IncompleteCheckpointError,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    StorageError,
    StorageUnavailableError,
)
from storage.local import LocalStore
from storage.s3 import S3Store

__all__ = [
    "COMPLETE_MARKER",
    "IncompleteCheckpointError",
    "LocalStore",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "S3Store",
    "StorageError",
    "StorageUnavailableError",
    "object_url",
    "open_store",
]


def open_store(
    url: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    **s3_options: Any,
) -> ObjectStore:
    """The store named by `url`.

    "file:///abs/path" and "file://./rel/path" give a LocalStore (the S3 arguments are
    ignored); "s3://bucket[/prefix]" gives an S3Store, creating the bucket if it is missing.
    Credentials and region left as None fall back to boto3's usual chain (environment,
    config files, instance role).

    `s3_options` are passed to S3Store: connect_timeout, read_timeout, max_attempts,
    retry_deadline_s, multipart_threshold, multipart_chunksize, max_concurrency,
    create_bucket. boto3's spellings aws_access_key_id, aws_secret_access_key and
    region_name are accepted as aliases of access_key, secret_key and region.
    """
    access_key = access_key or s3_options.pop("aws_access_key_id", None)
    secret_key = secret_key or s3_options.pop("aws_secret_access_key", None)
    region = region or s3_options.pop("region_name", None)
    for alias in ("aws_access_key_id", "aws_secret_access_key", "region_name"):
        s3_options.pop(alias, None)

    if url.startswith("file://"):
        path = url[len("file://") :]
        if not path:
            raise ValueError(f"invalid store URL {url!r}: no path")
        return LocalStore(path)
    if url.startswith("s3://"):
        rest = url[len("s3://") :]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ValueError(f"invalid store URL {url!r}: no bucket")
        return S3Store(
            bucket,
            prefix.strip("/"),
            endpoint_url=endpoint_url,
            region=region,
            access_key=access_key,
            secret_key=secret_key,
            **s3_options,
        )
    raise ValueError(f"invalid store URL {url!r}: expected file://PATH or s3://BUCKET[/PREFIX]")


def object_url(store: ObjectStore, key: str) -> str:
    """Where a process that shares no disk with us reads or writes `key` (a key or a "dir/"
    prefix): "s3://BUCKET/PREFIX/KEY" for an S3Store (fsspec/s3fs spell it so), the file's
    path for a LocalStore (a process on this machine: tests, a local launcher)."""
    from storage.keys import check_key

    check_key(key, prefix=True)
    if isinstance(store, S3Store):
        return f"s3://{store.bucket}/{store.prefix}{key}"
    if isinstance(store, LocalStore):
        path = str(store.root / key)
        return path + "/" if key.endswith("/") and not path.endswith("/") else path
    raise TypeError(f"no URL for the objects of {store!r}")
