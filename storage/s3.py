"""An S3 bucket (or a prefix in one) as an object store: AWS S3, SeaweedFS, MinIO, ...

Atomic writes follow the service-wide rule (temp key, then final key): data is uploaded to
`{prefix}.tmp/{uuid}` (multipart above the threshold) and then server-side copied to its key and
the temp object deleted. A plain S3 PUT is already all-or-nothing; the temp key adds that a
*failed or abandoned* upload never touches the final key, and that staging lives in one place
(`.tmp/`) a bucket lifecycle rule can expire.

Retries come in two layers. botocore's "standard" retry mode retries every request a few
times with jittered backoff (throttling, 5xx, dropped connections), which covers blips and
the parts of a multipart upload. On top, idempotent operations are retried for up to
`retry_deadline_s` seconds while the endpoint is unreachable, so an S3 restart of a few tens of
seconds is survived. After that the caller gets a StorageUnavailableError naming the endpoint,
the operation and the key. `put_stream` retries each buffered part the same way, but its
source iterator cannot be rewound, so a failure past the deadline fails the whole upload.
"""

from __future__ import annotations

import builtins
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import botocore.exceptions
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_before_delay,
    wait_exponential,
)

from storage.base import ObjectInfo, ObjectNotFound, StorageError, StoreBase, atomic_local_file
from storage.keys import check_key
from storage.s3_client import (
    BOTO_ERRORS,
    TRANSIENT_EXC,
    client_error_code,
    is_transient,
    list_objects,
    new_client,
    root_cause,
    storage_error,
    unfinished_uploads,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

MiB = 1 << 20


def _log_retry(op: str, key: str, deadline_s: float, state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning(
        "S3 %s of %r failed (%s); retrying in %.2fs, giving up in %.1fs",
        op, key, type(root_cause(exc)).__name__ if exc else "?", state.upcoming_sleep,
        deadline_s - (state.seconds_since_start or 0.0),
    )  # fmt: skip


class S3Store(StoreBase):
    """Objects in `bucket` under `prefix` (key "a/b" is object "{prefix}a/b")."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        max_attempts: int = 5,
        retry_deadline_s: float = 30.0,
        multipart_threshold: int = 8 * MiB,
        multipart_chunksize: int = 8 * MiB,
        max_concurrency: int = 8,
        create_bucket: bool = True,
    ) -> None:
        if prefix:
            check_key(prefix, prefix=True)
            prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint_url = endpoint_url
        self.retry_deadline_s = retry_deadline_s
        self._max_attempts = max_attempts
        self._part_size = max(multipart_chunksize, 5 * MiB)  # S3's minimum part size
        self._threshold = multipart_threshold
        config = Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"mode": "standard", "max_attempts": max_attempts},
            # Path-style for custom endpoints (SeaweedFS, MinIO) that have no wildcard DNS.
            s3={"addressing_style": "path" if endpoint_url else "auto"},
            signature_version="s3v4",
        )
        self._client = new_client(
            endpoint_url=endpoint_url,
            region_name=region,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            config=config,
        )
        self._transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=self._part_size,
            max_concurrency=max_concurrency,
        )
        if create_bucket:
            self._ensure_bucket(region)

    def __repr__(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"S3Store(s3://{self.bucket}/{self.prefix}{where})"

    # --- plumbing -----------------------------------------------------------------------------
    def _k(self, key: str, *, prefix: bool = False) -> str:
        return self.prefix + check_key(key, prefix=prefix)

    def _tmp_key(self) -> str:
        return f"{self.prefix}{self.TMP_DIR}/{uuid.uuid4().hex}"

    def _error(self, exc: BaseException, op: str, key: str) -> StorageError:
        return storage_error(exc, op, key, self.bucket, self.endpoint_url or "AWS S3")

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        """Run `fn`, retrying transient failures while the next try can still start within
        `retry_deadline_s` (on top of botocore's own per-request retries; backoff 0.25 s
        doubling to a short 2 s cap, so work resumes soon after S3 is back); translate
        failures into StorageError."""
        retrying = Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, BOTO_ERRORS) and is_transient(e)),
            wait=wait_exponential(multiplier=0.25, max=2.0),
            stop=stop_before_delay(self.retry_deadline_s),
            before_sleep=partial(_log_retry, op, key, self.retry_deadline_s),
            reraise=True,
        )
        try:
            return retrying(fn)
        except BOTO_ERRORS as exc:
            raise self._error(exc, op, key) from exc

    def _ensure_bucket(self, region: str | None) -> None:
        """Create the bucket if it is missing (the embedded/dev setups start from nothing)."""
        try:
            self._call("head_bucket", "", lambda: self._client.head_bucket(Bucket=self.bucket))
            return
        except ObjectNotFound:
            pass
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if region and region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            self._call("create_bucket", "", lambda: self._client.create_bucket(**kwargs))
        except StorageError as exc:
            code, _ = client_error_code(exc.__cause__ or exc)
            if code not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                raise

    def _publish(self, tmp: str, full_key: str, key: str) -> None:
        """Server-side copy temp → final (multipart copy above the threshold, so objects over
        CopyObject's 5 GiB limit work), then drop the temp object."""
        self._call(
            "copy",
            key,
            lambda: self._client.copy(
                {"Bucket": self.bucket, "Key": tmp}, self.bucket, full_key, Config=self._transfer
            ),
        )
        self._delete_raw(tmp, key)

    def _delete_raw(self, full_key: str, key: str) -> None:
        self._call(
            "delete", key, lambda: self._client.delete_object(Bucket=self.bucket, Key=full_key)
        )

    # --- writes -------------------------------------------------------------------------------
    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int:
        """Upload the chunks to `key` atomically; return the byte count.

        Parts are buffered one at a time (memory: one part), sent as a single PUT when the
        whole stream fits under the multipart threshold. If `chunks` raises, the multipart
        upload is aborted / the temp object deleted and the exception propagates.
        """
        full_key = self._k(key)
        tmp = self._tmp_key()
        it = iter(chunks)
        buf = bytearray()
        total = 0
        upload_id: str | None = None
        parts: list[dict[str, Any]] = []
        try:
            for chunk in it:
                buf += chunk
                total += len(chunk)
                if upload_id is None and len(buf) < max(self._threshold, 1):
                    continue
                if upload_id is None:
                    upload_id = self._call(
                        "create_multipart_upload",
                        key,
                        lambda: self._client.create_multipart_upload(Bucket=self.bucket, Key=tmp),
                    )["UploadId"]
                while len(buf) >= self._part_size:
                    self._upload_part(tmp, key, upload_id, parts, bytes(buf[: self._part_size]))
                    del buf[: self._part_size]
            if upload_id is None:
                body = bytes(buf)
                self._call(
                    "put",
                    key,
                    lambda: self._client.put_object(Bucket=self.bucket, Key=tmp, Body=body),
                )
            else:
                if buf or not parts:
                    self._upload_part(tmp, key, upload_id, parts, bytes(buf))
                uid = upload_id
                self._call(
                    "complete_multipart_upload",
                    key,
                    lambda: self._client.complete_multipart_upload(
                        Bucket=self.bucket, Key=tmp, UploadId=uid, MultipartUpload={"Parts": parts}
                    ),
                )
                upload_id = None  # completed: nothing to abort any more
            self._publish(tmp, full_key, key)
        except BaseException:
            self._cleanup_failed_put(tmp, upload_id)
            raise
        return total

    def _upload_part(
        self, tmp: str, key: str, upload_id: str, parts: list[dict[str, Any]], data: bytes
    ) -> None:
        number = len(parts) + 1
        resp = self._call(
            "upload_part",
            key,
            lambda: self._client.upload_part(
                Bucket=self.bucket, Key=tmp, UploadId=upload_id, PartNumber=number, Body=data
            ),
        )
        parts.append({"PartNumber": number, "ETag": resp["ETag"]})

    def _cleanup_failed_put(self, tmp: str, upload_id: str | None) -> None:
        """Best effort: the original error matters more than a failed cleanup (and `.tmp/` is
        swept by `purge_temp` or a lifecycle rule)."""
        try:
            if upload_id is not None:
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=tmp, UploadId=upload_id)
            self._client.delete_object(Bucket=self.bucket, Key=tmp)
        except Exception as exc:  # noqa: BLE001 - cleanup must not mask the real failure
            log.debug("cleanup of temp object %r failed: %s", tmp, exc)

    def put_file(self, key: str, path: Path) -> None:
        """Upload a local file to `key` atomically (multipart, parallel parts above the
        threshold). Retried as a whole while S3 is unreachable: the source can be re-read."""
        full_key = self._k(key)
        tmp = self._tmp_key()
        src = str(path)
        if not os.path.isfile(src):
            raise FileNotFoundError(src)
        try:
            self._call(
                "upload",
                key,
                lambda: self._client.upload_file(src, self.bucket, tmp, Config=self._transfer),
            )
            self._publish(tmp, full_key, key)
        except BaseException:
            self._cleanup_failed_put(tmp, None)
            raise

    def put_bytes(self, key: str, data: bytes) -> None:
        self.put_stream(key, [bytes(data)])

    # --- reads --------------------------------------------------------------------------------
    def get_stream(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """Chunks of the object. The GET is issued now (a missing key raises ObjectNotFound
        here, not at the first `next()`). A connection dropped mid-body is resumed with a
        ranged GET pinned to the same ETag, so a long download survives a blip without
        silently mixing two versions of the object."""
        full_key = self._k(key)
        resp = self._call(
            "get", key, lambda: self._client.get_object(Bucket=self.bucket, Key=full_key)
        )
        return self._iter_body(key, full_key, resp, chunk_size)

    def _iter_body(
        self, key: str, full_key: str, resp: dict[str, Any], chunk_size: int
    ) -> Iterator[bytes]:
        total = int(resp["ContentLength"])
        etag = resp.get("ETag")
        body = resp["Body"]
        offset = 0
        resumes = 0
        try:
            while True:
                try:
                    for chunk in body.iter_chunks(chunk_size):
                        offset += len(chunk)
                        yield chunk
                    if offset >= total:
                        return
                    raise botocore.exceptions.IncompleteReadError(
                        actual_bytes=offset, expected_bytes=total
                    )
                except TRANSIENT_EXC as exc:
                    body.close()
                    resumes += 1
                    if resumes > self._max_attempts:
                        raise self._error(exc, "get", key) from exc
                    again = self._call("get", key, partial(self._get_range, full_key, offset, etag))
                    body = again["Body"]
        finally:
            body.close()

    def _get_range(self, full_key: str, start: int, etag: str | None) -> dict[str, Any]:
        extra = {"IfMatch": etag} if etag else {}
        return self._client.get_object(
            Bucket=self.bucket, Key=full_key, Range=f"bytes={start}-", **extra
        )

    def download_file(self, key: str, path: Path) -> None:
        """Download to `path` atomically: a temporary sibling file (parallel ranged GETs above
        the threshold), fsync, rename."""
        full_key = self._k(key)
        with atomic_local_file(path) as tmp:
            self._call(
                "download",
                key,
                lambda: self._client.download_file(
                    self.bucket, full_key, str(tmp), Config=self._transfer
                ),
            )

    def _head(self, key: str) -> dict[str, Any]:
        full_key = self._k(key)
        return self._call(
            "head", key, lambda: self._client.head_object(Bucket=self.bucket, Key=full_key)
        )

    def exists(self, key: str) -> bool:
        try:
            self._head(key)
        except ObjectNotFound:
            return False
        return True

    def size(self, key: str) -> int:
        return int(self._head(key)["ContentLength"])

    def list(self, prefix: str) -> list[str]:
        """Sorted keys starting with `prefix` (relative to the store's own prefix), without the
        store's temporary objects."""
        return [o.key for o in self.scan(prefix)]

    # --- deletes and moves --------------------------------------------------------------------
    def delete(self, key: str) -> None:
        """Delete `key`; a missing key is fine (S3 DELETE is idempotent)."""
        self._delete_raw(self._k(key), key)

    def _delete_many(self, full_keys: builtins.list[str], what: str) -> None:
        for i in range(0, len(full_keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = [{"Key": k} for k in full_keys[i : i + 1000]]
            resp = self._call(
                "delete_prefix",
                what,
                partial(
                    self._client.delete_objects,
                    Bucket=self.bucket,
                    Delete={"Objects": batch, "Quiet": True},
                ),
            )
            errors = resp.get("Errors") or []
            if errors:
                first = errors[0]
                raise StorageError(
                    f"S3 delete_prefix of {what!r} failed for {len(errors)} key(s), e.g. "
                    f"{first.get('Key')!r}: {first.get('Code')} {first.get('Message')}"
                )

    def delete_prefix(self, prefix: str) -> None:
        """Delete every key starting with `prefix`; an empty prefix (the whole store) is
        refused."""
        if not prefix:
            raise ValueError("refusing to delete an empty prefix (the whole store)")
        full = self._k(prefix, prefix=True)
        self._delete_many([o["Key"] for o in self._list(full, prefix)], prefix)

    def move(self, src: str, dst: str) -> None:
        """Server-side copy `src` → `dst`, then delete `src`. Each step is idempotent, so a
        retry after a lost response is safe; a reader sees `dst` appear whole."""
        src_full, dst_full = self._k(src), self._k(dst)
        self._call(
            "move",
            src,
            lambda: self._client.copy(
                {"Bucket": self.bucket, "Key": src_full},
                self.bucket,
                dst_full,
                Config=self._transfer,
            ),
        )
        self._delete_raw(src_full, src)

    def presigned_url(self, key: str, expires: int = 3600) -> str | None:
        """A time-limited GET URL (signed locally; no request is made, so the object's
        existence is not checked)."""
        full_key = self._k(key)
        return str(
            self._client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": full_key}, ExpiresIn=expires
            )
        )

    # --- listings for the sweeper (worker.sweeper) --------------------------------------------
    def scan(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        """`list(prefix)` with each object's size and last-modified time."""
        tmp_root = f"{self.prefix}{self.TMP_DIR}/"
        objs = self._list(self._k(prefix, prefix=True), prefix)
        found = [self._info(o) for o in objs if not o["Key"].startswith(tmp_root)]
        return sorted(found, key=lambda o: o.key)

    def scan_temp(self) -> builtins.list[ObjectInfo]:
        """The temporary objects under `.tmp/`, and every unfinished multipart upload under
        the store's prefix (a writer killed mid-upload, or mid multipart copy): their parts
        take space but are no object, so no listing of objects shows them. An upload's time
        is that of its newest part (of its start if it has none yet)."""
        tmp_root = f"{self.prefix}{self.TMP_DIR}/"
        found = [self._info(o) for o in self._list(tmp_root, tmp_root)]
        uploads = self._call(
            "list_multipart_uploads",
            self.prefix,
            partial(unfinished_uploads, self._client, self.bucket, self.prefix),
        )
        n = len(self.prefix)
        return found + [ObjectInfo(k[n:], size, t, uid) for k, uid, size, t in uploads]

    def _list(self, full_prefix: str, what: str) -> builtins.list[dict[str, Any]]:
        """Every object under `full_prefix`, as list_objects_v2 describes it."""
        listing = partial(list_objects, self._client, self.bucket, full_prefix)
        return self._call("list", what, listing)

    def _info(self, obj: dict[str, Any]) -> ObjectInfo:
        return ObjectInfo(
            obj["Key"][len(self.prefix) :], int(obj["Size"]), obj["LastModified"].timestamp()
        )

    def _abort_upload(self, obj: ObjectInfo) -> None:
        uid = obj.upload_id
        try:
            self._call(
                "abort_multipart_upload",
                obj.key,
                lambda: self._client.abort_multipart_upload(
                    Bucket=self.bucket, Key=self.prefix + obj.key, UploadId=uid
                ),
            )
        except StorageError as exc:
            code, _ = client_error_code(root_cause(exc.__cause__ or exc))
            if code != "NoSuchUpload" and not isinstance(exc, ObjectNotFound):
                raise  # (an upload finished or aborted meanwhile is fine)

    def _delete_temp_file(self, name: str) -> None:
        key = f"{self.TMP_DIR}/{name}"
        self._delete_raw(self.prefix + key, key)
