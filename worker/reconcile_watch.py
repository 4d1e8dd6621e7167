"""The clocks of one attempt of a multi-node job, kept in its launch state (Job.launch) so any
worker's reconcile reads them: when a failed submit is tried again, and what counts as a
hang, a start that never comes, or an admission that never comes.

Only a real failure spends an attempt: a failed submit is tried again with backoff (the
attempt stays unsubmitted); time spent suspended (waiting for Kueue, or preempted by it) is
neither a hang nor a slow start, the clocks of the admitted attempt start at its admission.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.launchers.base import LaunchState, LaunchStatus

MAX_SUBMIT_DELAY = 600.0  # the backoff of failed submits grows to this, no further


def submit_due(state: dict[str, Any], now: float) -> bool:
    """The unsubmitted attempt may be submitted now (no failed submit is backing off)."""
    return now >= float(state.get("submit_at") or 0.0)


def submit_failed(state: dict[str, Any], now: float, backoff: float) -> float:
    """Record a failed submit: the next one waits `backoff` x 2^(failures - 1) seconds (at
    most MAX_SUBMIT_DELAY). Returns how long submits have failed in a row."""
    since = float(state.setdefault("submit_failing_since", now))
    failures = state["submit_failures"] = int(state.get("submit_failures", 0)) + 1
    state["submit_at"] = now + min(backoff * 2 ** (failures - 1), MAX_SUBMIT_DELAY)
    return now - since


def submitted(state: dict[str, Any]) -> None:
    for key in ("submit_at", "submit_failing_since", "submit_failures"):
        state.pop(key, None)


def overdue(
    state: dict[str, Any],
    status: LaunchStatus,
    now: float,
    heartbeat: Any,
    *,
    hang_s: float,
    start_s: float,
    admission_s: float,
) -> tuple[str, str] | None:
    """(reason, message) when the attempt has waited too long for what it is waiting for:
    admission (admission_s; 0 = forever), its ranks after admission (start_s), a new step
    (hang_s). Updates the clocks in `state`; None while all is in time."""
    if status.state is LaunchState.PENDING:  # suspended: every clock of the admitted stops
        for key in ("admitted_at", "progress_at", "seen", "ran"):
            state.pop(key, None)
        since = float(state.setdefault("pending_since", now))
        if admission_s > 0 and now - since > admission_s:
            return "admission_timeout", f"not admitted by the cluster in {now - since:.0f} s"
        return None
    if status.state not in (LaunchState.STARTING, LaunchState.RUNNING):
        return None
    state.pop("pending_since", None)
    admitted = float(state.setdefault("admitted_at", now))
    if status.state is LaunchState.RUNNING:
        state["ran"] = True
    elif not state.get("ran") and now - admitted > start_s:
        # all ranks never ran since this admission (once they have, a rank that ends before
        # node 0's export is not a slow start)
        why = status.message or "ranks not running"
        text = f"{status.ranks_running} of {status.ranks_total} ranks running"
        return "not_started", f"{text} {now - admitted:.0f} s after admission: {why}"
    marker = [heartbeat, state.get("metrics_offset", 0), state.get("events_offset", 0)]
    if state.get("progress_at") is None or marker != state.get("seen"):
        state["seen"], state["progress_at"] = marker, now
        return None
    if now - float(state["progress_at"]) > hang_s:
        return "hang", f"no new training step for {hang_s:g} s; stopped"
    return None


def heartbeat_step(path: Path) -> Any:
    """The step in rank 0's heartbeat.json (mirrored here by the tick), None without one."""
    try:
        return json.loads(path.read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        return None
