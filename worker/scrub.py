"""What a team may read of the worker's words: no server path, hostname or pid (DESIGN.md §6).

Everything a worker writes where a team reads it (job.error, job events, evaluation errors)
passes through `scrub` first (worker.attempt.LeasedAttempt.public); the child's stderr is cut
to its last lines by `error_tail`. Operators keep the whole stderr in the attempt's directory
(KEEP_RUN_DIRS) and the full lease owner in the worker's log.

    absolute path   under a known root (the attempt's directory, the installed packages, the
                    standard library, this project): relative to it, `run/checkpoints/step-2`,
                    `transformers/modeling_utils.py`; anywhere else `.../name`
    hostname        `<host>` (this machine's name, as a word; `localhost` says nothing)
    pid             `<pid>`: a number after "pid", and this worker's and its child's pids
                    anywhere (3 digits or more: a small number is too likely something else)
    keys            `host`, `hostname`, `pid`, `ppid` and `path` are dropped from dicts

`scrub(scrub(x)) == scrub(x)`: what it writes never looks like what it replaces.
"""

from __future__ import annotations

import os
import re
import site
import socket
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

TAIL_BYTES = 1024  # the most of a child's stderr a team reads
TAIL_LINES = 8  # the exception line and the lines (frames) before it
DROPPED_KEYS = frozenset({"host", "hostname", "pid", "ppid", "path"})
PROJECT_ROOT = Path(__file__).resolve().parents[1]

# A path starts at a "/" that follows nothing path-like: "a/b", "1/2", ".../x" and the
# "//host/x" of a URL are left alone ("file://" is dropped first: its path is a local one).
_PATH = re.compile(r"(?<![\w./~%-])(?!(?<=:)//)/[^\s'\"`<>()\[\]{},;:|*?\\]+")
_FILE_URL = re.compile(r"\bfile://(?=/)")
_PID_AFTER_WORD = re.compile(r"(?i)(?<![\w-])(pid\b[\s:=#]*)\d+")


@dataclass(frozen=True)
class Server:
    """What identifies this server in a text: directories shown relative to themselves
    (longest first), host names, pids."""

    roots: tuple[str, ...] = ()
    hostnames: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()


@lru_cache
def _code_roots() -> tuple[str, ...]:
    """Where Python code lives on this machine: tracebacks name files under these."""
    paths = sysconfig.get_paths()
    found = [paths.get(k) for k in ("purelib", "platlib", "stdlib", "platstdlib")]
    found += [*site.getsitepackages(), site.getusersitepackages(), str(PROJECT_ROOT)]
    return tuple({s for p in found if p for s in (str(Path(p)), str(Path(p).resolve()))})


def _hostnames() -> tuple[str, ...]:
    name = socket.gethostname()
    names = {name, name.split(".", 1)[0]} - {"", "localhost"}
    return tuple(names)


def this_server(*dirs: Path, pids: Iterable[int | None] = ()) -> Server:
    """This machine seen from an attempt: its `dirs` (its scratch directory), where code
    lives, the host's name, and `pids` (besides this process's own)."""
    roots: set[str] = set(_code_roots())
    for d in dirs:
        roots |= {str(Path(d)), str(Path(d).resolve())}
    known = {os.getpid(), *(p for p in pids if p is not None)}
    return Server(
        roots=tuple(sorted(roots - {"/"}, key=len, reverse=True)),
        hostnames=_hostnames(),
        pids=tuple(sorted(known)),
    )


def _path(match: re.Match[str], roots: tuple[str, ...]) -> str:
    text = match.group(0)
    path = text.rstrip(".")  # the end of a sentence, not of the path
    tail = text[len(path) :]
    for root in roots:
        if path == root:
            return "." + tail
        if path.startswith(root + "/"):
            return path[len(root) + 1 :] + tail
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return (f".../{name}" if name else "...") + tail


def scrub_text(text: str, server: Server) -> str:
    """`text` without server paths, host names or pids. (Addresses stay: a judge's URL is
    the team's own.)"""
    text = _FILE_URL.sub("", text)
    text = _PATH.sub(lambda m: _path(m, server.roots), text)
    for name in sorted(server.hostnames, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.<-]){re.escape(name)}(?![\w-])", "<host>", text)
    text = _PID_AFTER_WORD.sub(r"\1<pid>", text)
    for pid in server.pids:
        if pid >= 100:
            text = re.sub(rf"(?<![\w.]){pid}(?![\w.])", "<pid>", text)
    return text


def scrub(value: Any, server: Server) -> Any:
    """A JSON value (an error, an event's data) with every string scrubbed and the keys that
    name a host, pid or local path dropped."""
    if isinstance(value, str):
        return scrub_text(value, server)
    if isinstance(value, dict):
        return {k: scrub(v, server) for k, v in value.items() if k not in DROPPED_KEYS}
    if isinstance(value, (list, tuple)):
        return [scrub(v, server) for v in value]
    return value


def error_tail(stderr: str, server: Server) -> str:
    """The last lines of a child's stderr, scrubbed: the exception line and up to
    TAIL_LINES - 1 lines before it (progress bars split at their carriage returns), at most
    TAIL_BYTES (the exception line alone, cut, if it is longer)."""
    lines = [ln.rstrip() for ln in re.split(r"[\r\n]+", stderr) if ln.strip()]
    lines = [scrub_text(ln, server) for ln in lines[-TAIL_LINES:]]
    while len(lines) > 1 and len("\n".join(lines).encode()) > TAIL_BYTES:
        lines.pop(0)
    tail = "\n".join(lines)
    return tail.encode()[:TAIL_BYTES].decode("utf-8", "ignore")
