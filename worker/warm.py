"""Warm children: `python -m MODULE ARGS` forked from a process that has already imported
torch and transformers, instead of a fresh interpreter (EVAL_WARM_START).

    proc = warm.start(argv, env=env, cwd=dir, stdout=path, stderr=path, deathsig=SIGKILL)
    proc.poll() / proc.wait(timeout) / proc.pid      # what worker.attempt uses of a Popen

An evaluation of a small model spends most of its life importing (about 6 s of 8 on a CPU);
a study of a hundred small evaluations spends a quarter of an hour there. The warm process is
multiprocessing's fork server (one per worker process, started by the first warm child): it
imports PRELOAD once, then forks one child per launch. The child is what a cold launch is:
its own session and process group (worker.attempt.kill_group reaches it), `deathsig` when
the fork server dies (which it does when the worker goes), the attempt's directory as working
directory, its stdout and stderr in the attempt's files, the launch's environment, and
`python -m MODULE` run as __main__ with ARGS; its exit code is the module's.

What a warm child cannot change: what the preloaded modules read from the environment at
import (the fork server has the worker's). Nothing that decides a result is read there (the
devices, CUDA_VISIBLE_DEVICES, are read when CUDA starts, in the child); a launch with another
interpreter than the worker's (TRAINER_PYTHON) is started cold.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import runpy
import subprocess
import sys
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Protocol

PRELOAD = [
    "torch",
    "transformers",
    "trainer.evaluation.run",
    "trainer.evaluation.generation",
    "trainer.evaluation.math",
    "trainer.evaluation.instruction",
    "reports",
]

_context = multiprocessing.get_context("forkserver")


def can_start(argv: list[str]) -> bool:
    """A launch that can run warm: `<this interpreter> -m MODULE ...`."""
    return (
        len(argv) >= 3
        and argv[1] == "-m"
        and os.path.realpath(argv[0]) == os.path.realpath(sys.executable)
    )


class Child(Protocol):
    """A started child as worker.attempt follows it: a subprocess.Popen or a WarmProcess."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class WarmProcess:
    """The part of subprocess.Popen that worker.attempt uses, over a forked child."""

    def __init__(self, process: BaseProcess):
        self._process = process
        self.pid: int = process.pid  # type: ignore[assignment]
        self.args = process.name

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        rc = self._process.exitcode
        if rc is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return rc


def _redirect(path: Path, fd: int) -> None:
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, fd)
    os.close(target)


def _child(
    argv: list[str], env: dict[str, str], cwd: str, stdout: str, stderr: str, deathsig: int
) -> None:
    """In the forked child: become what a cold launch is, then run the module."""
    os.setsid()
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, deathsig, 0, 0, 0)
    os.chdir(cwd)
    # stdin is already /dev/null: multiprocessing's bootstrap reopens it before the target
    _redirect(Path(stdout), 1)
    _redirect(Path(stderr), 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    module, args = argv[2], argv[3:]
    sys.argv = [module, *args]
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def start(
    argv: list[str], *, env: dict[str, str], cwd: Path, stdout: Path, stderr: Path, deathsig: int
) -> WarmProcess:
    """Fork `argv` (`python -m MODULE ARGS`, can_start) from the warm process."""
    if not can_start(argv):
        raise ValueError(f"not a `{sys.executable} -m MODULE` launch: {argv[:3]}")
    _context.set_forkserver_preload(PRELOAD)  # read when the fork server starts (the first)
    process = _context.Process(
        target=_child,
        args=(argv, env, str(cwd), str(stdout), str(stderr), deathsig),
        name=" ".join(argv[1:3]),
        daemon=False,
    )
    process.start()
    return WarmProcess(process)
