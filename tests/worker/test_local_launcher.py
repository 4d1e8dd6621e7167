"""The local launcher: today's child process behind the Launcher interface."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from worker.launchers import LaunchRequest, LaunchState, LaunchStatus
from worker.launchers.local import LocalLauncher


def request(code: str, attempt: int = 1) -> LaunchRequest:
    return LaunchRequest("job-1", attempt, 1, 1, [sys.executable, "-c", code], {"X": "1"})


def wait_done(launcher: LocalLauncher, name: str) -> LaunchStatus:
    deadline = time.monotonic() + 20
    while (status := launcher.poll(name)).state == LaunchState.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return status


def test_submit_twice_starts_one_process_and_succeeds(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    code = "import os, time; open(f'pid-{os.getpid()}', 'w'); time.sleep(0.5)"
    name = launcher.submit(request(code))
    assert launcher.submit(request(code)) == name
    assert launcher.poll(name).state == LaunchState.RUNNING
    assert wait_done(launcher, name).state == LaunchState.SUCCEEDED
    assert len(list((tmp_path / name).glob("pid-*"))) == 1


def test_failure_carries_the_stderr_tail(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    code = "import os, sys; print('env', os.environ['X'], file=sys.stderr); sys.exit(3)"
    name = launcher.submit(request(code))
    status = wait_done(launcher, name)
    assert status.state == LaunchState.FAILED and "code 3: env 1" in (status.message or "")
    assert launcher.logs(name, tail_lines=1) == "env 1\n"


def test_cancel_kills_the_whole_group(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    child = "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
    child += "'import time; time.sleep(60)']); open('grandchild', 'w').write(str(p.pid)); "
    child += "time.sleep(60)"
    name = launcher.submit(request(child))
    marker = tmp_path / name / "grandchild"
    deadline = time.monotonic() + 20
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(marker.read_text())
    launcher.cancel(name)
    assert launcher.poll(name).state == LaunchState.MISSING
    deadline = time.monotonic() + 5
    while _alive(grandchild):
        assert time.monotonic() < deadline, "the grandchild survived the cancel"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        os.kill(pid, 0)
        return True
