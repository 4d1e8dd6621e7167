"""An in-memory Launcher and a stand-in for the ranks' writes to the store (rank 0's run log,
committed checkpoints, the export) for the reconcile tests: no cluster, no trainer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from storage.keys import checkpoint_prefix, final_model_prefix, run_file_key
from worker.launchers.base import LaunchRequest, LaunchState, LaunchStatus


class FakeLauncher:
    """Launches in a dict; the test moves them (`set`) as the cluster would."""

    def __init__(self) -> None:
        self.launches: dict[str, LaunchStatus] = {}
        self.requests: dict[str, LaunchRequest] = {}
        self.submits: list[str] = []
        self.cancels: list[str] = []
        self.log_text = "loading\nRuntimeError: NCCL timeout in /tmp/run/rank0.py line 3\n"

    def launch_name(self, job_id: str, attempt: int) -> str:
        return f"hl-{job_id.lower().replace('_', '-')}-a{attempt}"

    def submit(self, request: LaunchRequest) -> str:
        name = self.launch_name(request.job_id, request.attempt)
        self.submits.append(name)
        self.requests[name] = request
        self.launches.setdefault(name, LaunchStatus(LaunchState.PENDING))
        return name

    def poll(self, name: str) -> LaunchStatus:
        return self.launches.get(name, LaunchStatus(LaunchState.MISSING))

    def cancel(self, name: str) -> None:
        self.cancels.append(name)
        self.launches.pop(name, None)

    cleanup = cancel

    def logs(self, name: str, tail_lines: int = 200) -> str:
        return self.log_text if name in self.launches else ""

    def set(self, name: str, state: LaunchState, **kw: Any) -> None:
        self.launches[name] = LaunchStatus(state, **kw)


def put_run_log(
    store: Any, team: str, job: str, attempt: int, *, steps: int, checkpoints: list[int] = ()
) -> None:
    """What rank 0's mirror writes: metrics for steps 1..`steps`, a `started` event and one
    `checkpoint` event per step in `checkpoints`, heartbeat.json."""
    metrics = "".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, steps + 1))
    events = [{"kind": "started", "message": "started", "data": {"total_steps": 10}}]
    events += [
        {"kind": "checkpoint", "message": f"checkpoint at step {s}", "data": {"step": s}}
        for s in checkpoints
    ]
    text = "".join(json.dumps(e) + "\n" for e in events)
    store.put_bytes(run_file_key(team, job, attempt, "metrics.jsonl"), metrics.encode())
    store.put_bytes(run_file_key(team, job, attempt, "events.jsonl"), text.encode())
    beat = {"time": 0, "step": steps}
    store.put_bytes(run_file_key(team, job, attempt, "heartbeat.json"), json.dumps(beat).encode())


def commit_dir(store: Any, prefix: str, tmp: Path, files: dict[str, bytes]) -> None:
    """`files` under `prefix`, committed by its _COMPLETE manifest (what rank 0 writes last)."""
    tmp.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    store.upload_dir(prefix, tmp)


def commit_checkpoint(store: Any, team: str, job: str, step: int, tmp: Path) -> None:
    shards = {"__0_0.distcp": b"x" * 10, "state.json": b"{}"}
    commit_dir(store, checkpoint_prefix(team, job, step), tmp / f"step-{step}", shards)


def commit_final(store: Any, team: str, job: str, tmp: Path) -> None:
    files = {"model.safetensors": b"w" * 20, "config.json": b"{}"}
    commit_dir(store, final_model_prefix(team, job), tmp / "final", files)
