"""The launcher interface: submit (idempotent), poll, cancel, cleanup, logs.

One attempt of one job is one launch. Its name is decided by the launcher from the job id and
the attempt number alone (`launch_name`), so submitting the same request twice (a task
delivered twice, a worker that crashed between the submit and its DB write) finds the first
launch instead of starting a second one.

States a launch reports (`LaunchState`), whatever runs it:

    pending    accepted, not yet admitted (Kueue has it suspended, no capacity)
    starting   admitted; not every rank's process is running yet
    running    every rank is running
    succeeded  every rank exited 0
    failed     a rank failed, or the launch was given up (reason and message say which)
    missing    there is no such launch (never submitted, deleted, or lost)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

DISRUPTED = "Disrupted"  # LaunchStatus.reason of a launch a disruption ended (drain, preemption)


class LauncherError(Exception):
    """The launcher could not do what was asked (the cluster refused, or stayed unreachable
    after a bounded number of tries); the message says which call, on what, and why."""


class LaunchState(StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    MISSING = "missing"

    @property
    def terminal(self) -> bool:
        return self in (LaunchState.SUCCEEDED, LaunchState.FAILED)


@dataclass(frozen=True)
class LaunchRequest:
    """What one attempt needs started: `nodes` x `processes_per_node` ranks, each running
    `args` (the trainer's argv after the launcher's own torchrun) with `env` added."""

    job_id: str
    attempt: int
    nodes: int
    processes_per_node: int
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    gpus_per_node: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    requests: dict[str, str] = field(default_factory=dict)  # per node: cpu, memory


@dataclass(frozen=True)
class LaunchStatus:
    state: LaunchState
    reason: str | None = None  # a short machine word: the condition's reason
    message: str | None = None  # a sentence for a person
    ranks_running: int = 0
    ranks_total: int = 0


class Launcher(Protocol):
    def launch_name(self, job_id: str, attempt: int) -> str:
        """The deterministic name of (job, attempt)'s launch."""
        ...

    def submit(self, request: LaunchRequest) -> str:
        """Start the attempt, or adopt the launch already started for it; returns its name."""
        ...

    def poll(self, name: str) -> LaunchStatus:
        """Where the launch stands (LaunchState.MISSING when there is none)."""
        ...

    def cancel(self, name: str) -> None:
        """Stop the launch and remove it; a missing launch is fine."""
        ...

    def cleanup(self, name: str) -> None:
        """Remove a finished launch (and whatever it left on the cluster); idempotent."""
        ...

    def logs(self, name: str, tail_lines: int = 200) -> str:
        """The last lines of rank 0's (node 0's) output; "" when there is none."""
        ...
