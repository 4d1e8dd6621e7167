"""A directory on the local disk as an object store (the embedded deployment, and tests).

Atomic writes: data goes to a temporary file under `{root}/.tmp/` (same filesystem, so the
final `os.replace` is a rename), is fsync'ed, then renamed over the key's path, and the parent
directory is fsync'ed so the rename itself survives a power cut. Readers therefore see either
the old object or the whole new one.
"""

from __future__ import annotations

import builtins
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from storage.base import ObjectInfo, ObjectNotFound, StorageError, StoreBase, atomic_local_file
from storage.keys import check_key

_COPY_BUFFER = 1 << 20


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStore(StoreBase):
    """Objects are files under `root`; key "a/b/c" is the file `root/a/b/c`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        root_path = Path(root).expanduser()
        root_path.mkdir(parents=True, exist_ok=True)
        self.root = Path(os.path.realpath(root_path))
        self._tmp = self.root / self.TMP_DIR

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    # --- paths --------------------------------------------------------------------------------
    def _path(self, key: str, *, prefix: bool = False) -> Path:
        """The file for `key`, refusing anything that resolves outside the root (the key rules
        already forbid '..' and absolute keys; realpath also catches symlinks planted inside
        the root)."""
        check_key(key, prefix=prefix)
        path = self.root / key
        real = os.path.realpath(path)
        if real != str(self.root) and not real.startswith(str(self.root) + os.sep):
            raise ValueError(f"invalid key: {key!r} resolves outside the store root")
        return path

    def _temp_file(self) -> tuple[int, Path]:
        self._tmp.mkdir(exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self._tmp, prefix="put-")
        return fd, Path(name)

    def _publish(self, tmp: Path, key: str) -> None:
        dest = self._path(key)
        if dest.is_dir():
            raise StorageError(f"cannot write {key!r}: a 'directory' of other keys is there")
        for attempt in range(3):
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(tmp, dest)
                break
            except FileNotFoundError:
                # A concurrent delete pruned the (momentarily empty) parent between mkdir
                # and rename; make it again.
                if attempt == 2 or not tmp.exists():
                    raise
        _fsync_dir(dest.parent)

    def _prune_empty_dirs(self, start: Path) -> None:
        """Remove now-empty parent directories up to the root (S3 has no directories; leaving
        them would make `list` and disk usage drift from the S3 behaviour)."""
        d = start
        while d != self.root and self.root in d.parents:
            try:
                d.rmdir()
            except OSError:
                return
            d = d.parent

    # --- writes -------------------------------------------------------------------------------
    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int:
        """Write the chunks to `key` atomically; return the byte count. If `chunks` raises,
        the temporary file is removed and the exception propagates."""
        self._path(key)  # validate before consuming anything
        fd, tmp = self._temp_file()
        written = 0
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                    written += len(chunk)
                f.flush()
                os.fsync(f.fileno())
            self._publish(tmp, key)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return written

    def put_file(self, key: str, path: Path) -> None:
        """Copy a local file to `key` atomically."""
        with open(path, "rb") as src:
            self.put_stream(key, iter(lambda: src.read(_COPY_BUFFER), b""))

    def put_bytes(self, key: str, data: bytes) -> None:
        self.put_stream(key, [bytes(data)])

    # --- reads --------------------------------------------------------------------------------
    def get_stream(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """Chunks of the object. The file is opened now, so a missing key raises ObjectNotFound
        here and not at the first `next()` (an HTTP handler can still answer 404)."""
        path = self._path(key)
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed by the generator below
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(key) from None

        def chunks() -> Iterator[bytes]:
            with f:
                while block := f.read(chunk_size):
                    yield block

        return chunks()

    def download_file(self, key: str, path: Path) -> None:
        """Copy the object to `path` atomically (temporary sibling file, fsync, rename)."""
        src = self._path(key)
        if not src.is_file():
            raise ObjectNotFound(key)
        with atomic_local_file(path) as tmp:
            try:
                shutil.copyfile(src, tmp)
            except FileNotFoundError:  # deleted meanwhile
                raise ObjectNotFound(key) from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        path = self._path(key)
        if not path.is_file():
            raise ObjectNotFound(key)
        return path.stat().st_size

    def list(self, prefix: str) -> list[str]:
        """Sorted keys starting with `prefix` (a string prefix, as in S3: "a/b" matches
        "a/b/c" and "a/bc")."""
        self._path(prefix, prefix=True)
        head, _, _ = prefix.rpartition("/")
        base = self.root / head if head else self.root
        if not base.is_dir():
            return []
        keys: list[str] = []
        for dirpath, dirnames, filenames in os.walk(base):
            here = Path(dirpath)
            if here == self.root:
                dirnames[:] = [d for d in dirnames if d != self.TMP_DIR]
            rel_dir = here.relative_to(self.root).as_posix()
            for name in filenames:
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        keys.sort()
        return keys

    def scan(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        """`list(prefix)` with each object's size and modification time (an object deleted
        meanwhile is left out)."""
        return [info for key in self.list(prefix) if (info := self._info(key, self.root / key))]

    def scan_temp(self) -> builtins.list[ObjectInfo]:
        """The files under `.tmp/`: writes in flight, and those of processes that died."""
        if not self._tmp.is_dir():
            return []
        tmp = self._tmp
        found = (self._info(f"{self.TMP_DIR}/{p.name}", p) for p in sorted(tmp.iterdir()))
        return [info for info in found if info is not None]

    def _delete_temp_file(self, name: str) -> None:
        (self._tmp / name).unlink(missing_ok=True)

    @staticmethod
    def _info(key: str, path: Path) -> ObjectInfo | None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return ObjectInfo(key, st.st_size, st.st_mtime)

    # --- deletes and moves --------------------------------------------------------------------
    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except IsADirectoryError:
            return  # a "directory" is not an object
        self._prune_empty_dirs(path.parent)

    def delete_prefix(self, prefix: str) -> None:
        """Delete every key starting with `prefix`. An empty prefix is refused: wiping the
        whole store is never what a caller of this method means."""
        if not prefix:
            raise ValueError("refusing to delete an empty prefix (the whole store)")
        for key in self.list(prefix):
            self.delete(key)

    def move(self, src: str, dst: str) -> None:
        """Rename `src` to `dst` (atomic: same filesystem); `dst` is replaced if present."""
        src_path, dst_path = self._path(src), self._path(dst)
        if not src_path.is_file():
            raise ObjectNotFound(src)
        dst_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(src_path, dst_path)
        except FileNotFoundError:
            raise ObjectNotFound(src) from None
        _fsync_dir(dst_path.parent)
        self._prune_empty_dirs(src_path.parent)

    def presigned_url(self, key: str, expires: int = 3600) -> str | None:
        """None: local objects are served by the API itself, there is nothing to presign."""
        self._path(key)
        return None
