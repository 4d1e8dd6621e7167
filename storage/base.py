"""The object-store interface, its errors, and the checkpoint-directory logic both stores share.

Callers (API, worker) see only `ObjectStore` and the `StorageError` family, never botocore:
the embedded deployment runs on `LocalStore` and production on `S3Store`, and code that works
on one must work on the other.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from contract.runs import COMPLETE_MARKER
from contract.runs import MANIFEST_VERSION as _MANIFEST_VERSION
from storage.keys import RESERVED_ROOT, check_key


class StorageError(Exception):
    """Any failure of the object store (the only exception family callers need to catch)."""


class ObjectNotFound(StorageError, FileNotFoundError):
    """The key does not exist. Also a FileNotFoundError, so `except FileNotFoundError` works."""

    def __init__(self, key: str) -> None:
        super().__init__(f"object not found: {key!r}")
        self.key = key


class StorageUnavailableError(StorageError):
    """The backend could not be reached (after retries); the request may succeed later."""


class IncompleteCheckpointError(StorageError):
    """A checkpoint prefix has no `_COMPLETE` marker: it is torn (a writer died) or absent."""


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object as a listing sees it: what a sweep needs to judge it.

    `key` is the object's key, or for a temporary object (`scan_temp`) its name under the
    store's reserved temporary area. `modified` is Unix time: the last write, or for an
    unfinished S3 multipart upload (`upload_id` set) when it began; `size` is then the bytes
    of the parts uploaded so far."""

    key: str
    size: int
    modified: float
    upload_id: str | None = None


@runtime_checkable
class ObjectStore(Protocol):
    """What the service needs from object storage. Keys are '/'-separated and checked by
    `storage.keys.check_key`; writes are atomic (a reader sees the old object, or none, or the
    whole new one, never a prefix of it)."""

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int: ...
    def put_file(self, key: str, path: Path) -> None: ...
    def put_bytes(self, key: str, data: bytes) -> None: ...
    def get_stream(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]: ...
    def get_bytes(self, key: str) -> bytes: ...
    def download_file(self, key: str, path: Path) -> None: ...
    def exists(self, key: str) -> bool: ...
    def size(self, key: str) -> int: ...
    def delete(self, key: str) -> None: ...
    def delete_prefix(self, prefix: str) -> None: ...
    def list(self, prefix: str) -> list[str]: ...
    def move(self, src: str, dst: str) -> None: ...
    def presigned_url(self, key: str, expires: int = 3600) -> str | None: ...
    def upload_dir(self, prefix: str, local_dir: Path) -> builtins.list[str]: ...
    def download_dir(
        self, prefix: str, local_dir: Path, *, keep_marker: bool = False
    ) -> None: ...
    def scan(self, prefix: str = "") -> builtins.list[ObjectInfo]: ...
    def scan_temp(self) -> builtins.list[ObjectInfo]: ...
    def delete_temp(self, obj: ObjectInfo) -> None: ...
    def purge_temp(
        self, older_than_s: float, *, now: float | None = None
    ) -> builtins.list[ObjectInfo]: ...


@contextmanager
def atomic_local_file(path: Path) -> Iterator[Path]:
    """A temporary sibling of `path` for a download to fill: once the block ends it is
    fsync'ed and renamed over `path`; on any failure it is removed (no `.part` left)."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def temp_name(key: str) -> str:
    """NAME of a temporary object's key ".tmp/NAME" (as `scan_temp` lists it); ValueError for
    any other key, or a NAME that is empty, '.', '..' or holds a '/' or '\\' (one file right
    under the reserved area, nothing a path could climb out of). Both stores' `delete_temp`."""
    head, _, name = key.partition("/")
    if head != RESERVED_ROOT or name in ("", ".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"not a temporary object: {key!r}")
    return name


def _dir_prefix(prefix: str) -> str:
    """A checkpoint prefix must be a non-empty "directory" prefix ending in '/'."""
    check_key(prefix, prefix=True)
    if not prefix:
        raise ValueError("a directory prefix must not be empty")
    return prefix if prefix.endswith("/") else prefix + "/"


def _local_manifest(root: Path) -> dict[str, int] | None:
    """{relative path: size} of the local `_COMPLETE` manifest in `root`; None without one."""
    marker = root / COMPLETE_MARKER
    if not marker.is_file():
        return None
    try:
        doc = json.loads(marker.read_bytes())
        return {_check_relpath(str(f["path"])): int(f["size"]) for f in doc["files"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{root} holds a file named {COMPLETE_MARKER} that is not a checkpoint manifest"
        ) from exc


def _check_relpath(rel: str) -> str:
    """A manifest entry: a relative '/'-path with no way out of the directory."""
    check_key(rel)
    if rel == COMPLETE_MARKER:
        raise ValueError(f"a checkpoint may not contain a file named {COMPLETE_MARKER}")
    return rel


class StoreBase:
    """Operations defined once in terms of the primitives each backend implements."""

    TMP_DIR = RESERVED_ROOT  # reserved first segment for in-flight temporary objects

    # --- primitives (implemented by LocalStore and S3Store) ---------------------------------
    def put_file(self, key: str, path: Path) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def put_bytes(self, key: str, data: bytes) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def get_stream(
        self, key: str, chunk_size: int = 1 << 20
    ) -> Iterator[bytes]:  # pragma: no cover - abstract
        raise NotImplementedError

    def download_file(self, key: str, path: Path) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def size(self, key: str) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def delete(self, key: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def delete_prefix(self, prefix: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def scan(self, prefix: str = "") -> list[ObjectInfo]:  # pragma: no cover - abstract
        """Every object under `prefix` with its size and age (temporary objects excluded)."""
        raise NotImplementedError

    def scan_temp(self) -> list[ObjectInfo]:  # pragma: no cover - abstract
        """The temporary objects of writes in flight, or of writers that died."""
        raise NotImplementedError

    def _delete_temp_file(self, name: str) -> None:  # pragma: no cover - abstract
        """Remove the temporary object `.tmp/NAME` (gone already is fine)."""
        raise NotImplementedError

    def _abort_upload(self, obj: ObjectInfo) -> None:  # pragma: no cover - S3 only
        """Abort the unfinished multipart upload `obj` (gone already is fine)."""
        raise NotImplementedError

    # --- shared ------------------------------------------------------------------------------
    def delete_temp(self, obj: ObjectInfo) -> None:
        """Remove one temporary object of `scan_temp`: an unfinished upload (S3's multipart),
        or `.tmp/NAME`, whose NAME is checked here for every store (temp_name)."""
        if obj.upload_id is not None:
            self._abort_upload(obj)
        else:
            self._delete_temp_file(temp_name(obj.key))

    def purge_temp(self, older_than_s: float, *, now: float | None = None) -> list[ObjectInfo]:
        """Delete the temporary objects last written more than `older_than_s` seconds ago and
        return them: those of crashed writers. A write in progress renews its temporary
        object's time with every block (local) or part (S3 multipart) it writes, so
        `older_than_s` must exceed the longest pause between two of them."""
        cutoff = (time.time() if now is None else now) - older_than_s
        old = [obj for obj in self.scan_temp() if obj.modified < cutoff]
        for obj in old:
            self.delete_temp(obj)
        return old

    def get_bytes(self, key: str) -> bytes:
        """The whole object in memory (small objects: manifests, reports)."""
        return b"".join(self.get_stream(key))

    def upload_dir(self, prefix: str, local_dir: Path) -> list[str]:
        """Upload every regular file under `local_dir` to `prefix`, then write the `_COMPLETE`
        marker last. Returns the keys written, in order (the marker is the last one).

        The marker holds a manifest (relative path and size of each file), so a reader
        downloads exactly the files of this upload and can tell a complete checkpoint from a
        torn one. Re-uploading a prefix first removes its marker (so the old checkpoint stops
        being "complete" before any file of it is overwritten) and then its objects (so files
        of an earlier, torn attempt cannot mix in).

        A directory committed by a local `_COMPLETE` of its own (the trainer's checkpoints, a
        downloaded checkpoint) uploads exactly the files its manifest lists, sizes checked;
        the local marker is not uploaded as data (the store's marker is written last, as
        always). A local `_COMPLETE` that is not such a manifest is refused (ValueError).
        """
        prefix = _dir_prefix(prefix)
        root = Path(local_dir)
        if not root.is_dir():
            raise NotADirectoryError(f"not a directory: {root}")
        committed = _local_manifest(root)
        files: list[tuple[str, Path]] = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if not path.is_file():  # sockets, fifos, dangling links
                    continue
                rel = path.relative_to(root).as_posix()
                if committed is not None and (rel == COMPLETE_MARKER or rel not in committed):
                    continue  # the local marker, or a file written after the commit
                files.append((_check_relpath(rel), path))
        if committed is not None:
            sizes = {rel: path.stat().st_size for rel, path in files}
            if sizes != committed:
                raise ValueError(f"{root} does not hold the files its {COMPLETE_MARKER} lists")

        self.delete(prefix + COMPLETE_MARKER)
        self.delete_prefix(prefix)
        written: list[str] = []
        manifest: list[dict[str, object]] = []
        for rel, path in files:
            key = prefix + rel
            size = path.stat().st_size
            self.put_file(key, path)
            written.append(key)
            manifest.append({"path": rel, "size": size})
        marker = json.dumps({"version": _MANIFEST_VERSION, "files": manifest}, indent=1)
        self.put_bytes(prefix + COMPLETE_MARKER, marker.encode())
        written.append(prefix + COMPLETE_MARKER)
        return written

    def read_manifest(self, prefix: str) -> list[tuple[str, int]]:
        """(relative path, size) of each file of a complete checkpoint at `prefix`;
        IncompleteCheckpointError if the marker is missing."""
        prefix = _dir_prefix(prefix)
        try:
            raw = self.get_bytes(prefix + COMPLETE_MARKER)
        except ObjectNotFound:
            raise IncompleteCheckpointError(
                f"checkpoint {prefix!r} is incomplete: no {COMPLETE_MARKER} marker"
            ) from None
        try:
            doc = json.loads(raw)
            entries = [(str(f["path"]), int(f["size"])) for f in doc["files"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise IncompleteCheckpointError(
                f"checkpoint {prefix!r} has an unreadable {COMPLETE_MARKER} marker"
            ) from exc
        for rel, _ in entries:
            _check_relpath(rel)
        return entries

    def is_complete(self, prefix: str) -> bool:
        """True when `prefix` holds a complete checkpoint (its marker exists)."""
        try:
            self.size(_dir_prefix(prefix) + COMPLETE_MARKER)
        except ObjectNotFound:
            return False
        return True

    def download_dir(self, prefix: str, local_dir: Path, *, keep_marker: bool = False) -> None:
        """Download the complete checkpoint at `prefix` into `local_dir`; with `keep_marker`,
        its manifest is written last as `local_dir/_COMPLETE` (the local commit marker a
        trainer resuming from the directory looks for).

        Refuses (IncompleteCheckpointError) a prefix without marker or whose objects do not
        match the manifest. Files are staged in a sibling temporary directory and moved into
        `local_dir` only once all of them arrived, so a failure leaves `local_dir` untouched.
        """
        prefix = _dir_prefix(prefix)
        entries = self.read_manifest(prefix)
        dest = Path(local_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent))
        try:
            for rel, size in entries:
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    self.download_file(prefix + rel, target)
                except ObjectNotFound:
                    raise IncompleteCheckpointError(
                        f"checkpoint {prefix!r} is torn: {rel!r} is listed but missing"
                    ) from None
                got = target.stat().st_size
                if got != size:
                    raise IncompleteCheckpointError(
                        f"checkpoint {prefix!r} is torn: {rel!r} has {got} bytes, "
                        f"manifest says {size}"
                    )
            dest.mkdir(parents=True, exist_ok=True)
            for rel, _ in entries:
                final = dest / rel
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging / rel, final)
            if keep_marker:
                files = [{"path": rel, "size": size} for rel, size in entries]
                marker = json.dumps({"version": _MANIFEST_VERSION, "files": files})
                (dest / COMPLETE_MARKER).write_text(marker)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
