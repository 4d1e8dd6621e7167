"""A launch as a local subprocess: today's child process behind the Launcher interface.

The child is started exactly as worker.attempt starts it: its own process group (killpg
reaches every rank), PR_SET_PDEATHSIG (a SIGKILLed worker leaves no child), stdin closed,
stdout/stderr to `stdout.log` / `stderr.log` in the launch's directory. The argv is
`prefix + request.args` (prefix empty by default: the caller passes the whole command line,
as worker.attempt's Launch.argv does today). Launches live in this process's memory: a
launcher that restarts knows none of them (they died with it, PR_SET_PDEATHSIG)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from worker.attempt import STDERR_LOG, die_with_parent, kill_group
from worker.launchers.base import LaunchRequest, LaunchState, LaunchStatus


class LocalLauncher:
    def __init__(
        self, root: Path, prefix: Sequence[str] = (), deathsig: int = signal.SIGTERM
    ) -> None:
        self.root, self.prefix, self.deathsig = Path(root), list(prefix), deathsig
        self.procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}

    def launch_name(self, job_id: str, attempt: int) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]", "-", f"{job_id}-a{attempt}")

    def submit(self, request: LaunchRequest) -> str:
        name = self.launch_name(request.job_id, request.attempt)
        if name in self.procs:  # a second submit finds the first launch
            return name
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "stdout.log", "wb") as out, open(folder / STDERR_LOG, "wb") as err:
            proc = subprocess.Popen(
                [*self.prefix, *request.args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env={**os.environ, **request.env},
                cwd=folder,
                start_new_session=True,  # its own process group: killpg reaches every rank
                preexec_fn=die_with_parent(self.deathsig),  # noqa: PLW1509
            )
        self.procs[name] = (proc, request.nodes * request.processes_per_node)
        return name

    def poll(self, name: str) -> LaunchStatus:
        if name not in self.procs:
            return LaunchStatus(LaunchState.MISSING, message=f"no local launch {name}")
        proc, ranks = self.procs[name]
        rc = proc.poll()
        if rc is None:
            return LaunchStatus(LaunchState.RUNNING, ranks_running=ranks, ranks_total=ranks)
        if rc == 0:
            return LaunchStatus(LaunchState.SUCCEEDED, ranks_total=ranks)
        tail = self.logs(name, tail_lines=20).strip()
        message = f"the child exited with code {rc}" + (f": {tail}" if tail else "")
        return LaunchStatus(LaunchState.FAILED, "ExitCode", message, ranks_total=ranks)

    def cancel(self, name: str) -> None:
        proc, _ = self.procs.pop(name, (None, 0))
        kill_group(proc)

    def cleanup(self, name: str) -> None:
        self.cancel(name)

    def logs(self, name: str, tail_lines: int = 200) -> str:
        path = self.root / name / STDERR_LOG
        try:
            lines = path.read_text(errors="replace").splitlines(keepends=True)
        except FileNotFoundError:
            return ""
        return "".join(lines[-tail_lines:])
