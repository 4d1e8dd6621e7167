"""What the benchmarks read of Linux's /proc: CPU time, memory marks, a process's children.

    status_kb(field, pid)     a /proc/<pid>/status figure in kB (VmRSS, VmHWM, ...)
    reset_peak(pid)           VmHWM := the current RSS (write 5 to clear_refs, Linux >= 4.0)
    cpu_seconds(pids)         user + system CPU time of these processes so far
    children(pid)             a process's direct children
    process_tree(root)        a process and all its descendants
    cmdline(pid)              its command line, "" once it has gone
    PhasePeaks                this process's peak RSS in each named phase of its work

`pid` is "self" (this process) unless given.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any


def status_kb(field: str, pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(f"no {field} in /proc/{pid}/status")


def reset_peak(pid: int | str = "self") -> bool:
    """Reset VmHWM to the current RSS; False where the kernel does not allow it."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (/proc/<pid>/stat fields 14 and 15);
    a process that has gone counts nothing."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def children(pid: int) -> list[int]:
    pids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    return pids


def process_tree(root: int) -> list[int]:
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo += children(pid)
    return pids


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class PhasePeaks:
    """Peak RSS (MB) of this process in each named phase, sampled by a daemon thread every
    `every` seconds (VmHWM only knows the peak of the whole run). `wrap(obj, "step", "optim")`
    makes every call of `obj.step` count as the phase "optim"; `take()` returns the peaks since
    the last take and starts afresh. Time outside every wrapped call counts as "other"."""

    def __init__(self, every: float = 0.003) -> None:
        self.current = "other"
        self.peaks: dict[str, float] = {}
        threading.Thread(target=self._sample, args=(every,), daemon=True).start()

    def _sample(self, every: float) -> None:
        page_mb = os.sysconf("SC_PAGE_SIZE") / 2**20
        while True:
            rss = int(Path("/proc/self/statm").read_text().split()[1]) * page_mb
            phase = self.current
            if rss > self.peaks.get(phase, 0.0):
                self.peaks[phase] = rss
            time.sleep(every)

    def wrap(self, obj: Any, name: str, phase: str) -> None:
        call = getattr(obj, name)

        def in_phase(*args: Any, **kwargs: Any) -> Any:
            outer, self.current = self.current, phase
            try:
                return call(*args, **kwargs)
            finally:
                self.current = outer

        setattr(obj, name, in_phase)

    def take(self) -> dict[str, float]:
        peaks, self.peaks = self.peaks, {}
        return {phase: round(mb, 1) for phase, mb in peaks.items()}
