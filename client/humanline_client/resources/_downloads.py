"""The files of a directory download (`jobs.download_model`, `jobs.download_checkpoint`):
where each goes, and how each is reported as it lands."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Optional, Union

from .._exceptions import HumanlineError


@dataclass(frozen=True)
class FileDownload:
    """One file of a directory download, just written: the `index`-th of `count`."""

    name: str
    path: Path
    bytes: int
    index: int
    count: int

    def line(self) -> str:
        return f"[{self.index}/{self.count}] {self.name} ({_size(self.bytes)})"


Progress = Union[bool, None, Callable[[FileDownload], Any]]


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def _print_line(item: FileDownload) -> None:
    print(item.line(), file=sys.stderr, flush=True)


def reporter(progress: Progress) -> Optional[Callable[[FileDownload], Any]]:
    """None (a line per file on stderr when it is a terminal), True (always), False
    (never), or your own callable."""
    if callable(progress):
        return progress
    if progress is None:
        progress = sys.stderr.isatty()
    return _print_line if progress else None


def target_path(dest: Path, name: str) -> Path:
    """Where file `name` of a directory goes under `dest` (never outside it)."""
    parts = PurePosixPath(name).parts
    if not parts or PurePosixPath(name).is_absolute() or ".." in parts:
        raise HumanlineError(f"refusing to write {name!r} outside {dest}")
    return dest.joinpath(*parts)
