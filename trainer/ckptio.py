"""Where checkpoints live: a checkpoint ROOT that is a local directory or an fsspec URL
(`s3://bucket/prefix/`, through s3fs with the standard AWS environment), and the few file
operations trainer.checkpoint needs on either. fsspec is imported only for a URL: the GPU
machines that run single-node jobs need neither fsspec nor s3fs.

DCP's readers unpickle the checkpoint's `.metadata` and `torch.load` its byte entries with
weights_only=False; a checkpoint crosses machines through the store, so ours never load a
pickle that could run code: `.metadata` goes through a restricted unpickler (DCP's metadata
classes, torch's sizes and dtypes, nothing else) and every non-tensor state lives in plain
`.pt` files read with trainer.checkpoint.load_state.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

Root = str | Path  # a local directory or an fsspec URL


class UnsafeCheckpoint(ValueError):
    """A checkpoint file holds something other than tensors, plain data and the few types
    trainer.ckptstate.CHECKPOINT_TYPES allows."""


def is_url(root: Root) -> bool:
    return isinstance(root, str) and "://" in root and not root.startswith("file://")


def join(root: Root, *names: str) -> Root:
    if is_url(root):
        return "/".join([str(root).rstrip("/"), *names])
    return Path(str(root).removeprefix("file://")).joinpath(*names)


def _fs(url: Root):
    from fsspec.core import url_to_fs  # lazily: only a URL root needs fsspec

    return url_to_fs(str(url))[0]


def write_bytes(path: Root, data: bytes) -> None:
    if is_url(path):
        with _fs(path).open(str(path), "wb") as fh:
            fh.write(data)
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def read_bytes(path: Root) -> bytes:
    if is_url(path):
        with _fs(path).open(str(path), "rb") as fh:
            return fh.read()
    return Path(path).read_bytes()


def exists(path: Root) -> bool:
    return _fs(path).exists(str(path)) if is_url(path) else Path(path).exists()


def remove_tree(path: Root) -> None:
    """Remove a directory or a file (absent is fine)."""
    if is_url(path):
        fs = _fs(path)
        if fs.exists(str(path)):
            fs.rm(str(path), recursive=True)
        return
    if Path(path).is_file():
        Path(path).unlink()
    shutil.rmtree(path, ignore_errors=True)


def list_dirs(root: Root) -> list[str]:
    """Names of the entries directly under `root` (none if it does not exist)."""
    if is_url(root):
        fs = _fs(root)
        if not fs.exists(str(root)):
            return []
        return [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(str(root), detail=False)]
    root = Path(root)
    return [p.name for p in root.iterdir()] if root.is_dir() else []


def list_files(directory: Root) -> list[tuple[str, int]]:
    """(path relative to `directory`, size) of every file under it, sorted."""
    if is_url(directory):
        fs = _fs(directory)
        base = fs._strip_protocol(str(directory)).rstrip("/") + "/"
        found = fs.find(str(directory), detail=True)
        return sorted(
            (name[len(base) :], int(info["size"]))
            for name, info in found.items()
            if info.get("type") != "directory"
        )
    root = Path(directory)
    return sorted(
        (p.relative_to(root).as_posix(), p.stat().st_size) for p in root.rglob("*") if p.is_file()
    )


# ---- DCP storage, with safe metadata --------------------------------------------------------

# The globals a DCP `.metadata` pickle holds (torch 2.13): DCP's own dataclasses and enums,
# torch's sizes, dtypes and layouts, the checkpoint's path, and collections.OrderedDict:
# building any of them runs no code of the file's choosing.
_SAFE_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_SAFE_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        import torch

        ok = (
            module in _SAFE_MODULES
            or (module, name) in _SAFE_GLOBALS
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.layout))
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.memory_format))
        )
        if not ok:
            raise UnsafeCheckpoint(
                f"checkpoint metadata refers to {module}.{name}, which a DCP checkpoint "
                "never holds; refusing to load it"
            )
        return super().find_class(module, name)


def _safe_metadata(reader, rank: int | None = None):
    from torch.distributed.checkpoint.metadata import StorageMeta

    name = ".metadata" if rank is None else f"__{rank}.metadata"
    path = reader.fs.concat_path(reader.path, name)
    with reader.fs.create_stream(path, "rb") as fh:
        metadata = _MetadataUnpickler(io.BytesIO(fh.read())).load()
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    metadata.storage_meta.load_id = reader.load_id
    return metadata


def storage_writer(path: Root):
    """DCP's writer for `path`, whose `.metadata` does not record where it was written (DCP
    stores the checkpoint's path there: a server path the team would download)."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.metadata import StorageMeta

    base = FileSystemWriter
    if is_url(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        base = FsspecWriter

    class Writer(base):  # type: ignore[misc,valid-type]
        def storage_meta(self) -> StorageMeta | None:
            return StorageMeta(checkpoint_id=None, save_id=self.save_id)

    return Writer(str(path), sync_files=not is_url(path))


def storage_reader(path: Root):
    from torch.distributed.checkpoint import FileSystemReader

    if is_url(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        class SafeFsspecReader(FsspecReader):
            def read_metadata(self, *args: Any, **kwargs: Any):
                return _safe_metadata(self, kwargs.get("rank"))

        return SafeFsspecReader(str(path))

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            return _safe_metadata(self, kwargs.get("rank"))

    return SafeReader(str(path))
