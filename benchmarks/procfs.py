"""What the benchmarks read of Linux's /proc: CPU time, memory marks, a process's children.

    status_kb(field, pid)     a /proc/<pid>/status figure in kB (VmRSS, VmHWM, ...)
    reset_peak(pid)           VmHWM := the current RSS (write 5 to clear_refs, Linux >= 4.0)
    cpu_seconds(pids)         user + system CPU time of these processes so far
    children(pid)             a process's direct children
    process_tree(root)        a process and all its descendants
    cmdline(pid)              its command line, "" once it has gone

`pid` is "self" (this process) unless given.
"""

from __future__ import annotations

import os
from pathlib import Path


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
