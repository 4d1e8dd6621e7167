"""The trainer's `progress` events: throttled by time, the first and the last step always."""

from __future__ import annotations

import json

from contract.runs import EVENTS_FILE
from trainer import runlog
from trainer.runlog import ProgressEvents, RunLog


def test_progress_events_are_throttled_but_first_and_last_always_report(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(runlog.time, "monotonic", lambda: clock[0])
    progress = ProgressEvents(RunLog(tmp_path), start=0, total=10, every_s=10.0)
    for step in range(1, 11):
        clock[0] += 3.0  # a step takes 3 s: step k ends at 100 + 3k
        progress.after(step, 0.5)
    lines = (tmp_path / EVENTS_FILE).read_text().splitlines()
    events = [json.loads(line)["data"] for line in lines]
    # step 1 (first); then 10 s after the last report: step 5 (115 s), step 9 (127 s); the last
    assert [e["step"] for e in events] == [1, 5, 9, 10]
    assert events[1]["eta_s"] == 15.0  # 15 s for 5 steps, 5 to go
    assert events[-1]["eta_s"] == 0.0 and all(e["total_steps"] == 10 for e in events)


def test_a_resumed_run_reports_its_first_step_and_times_from_there(tmp_path, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(runlog.time, "monotonic", lambda: clock[0])
    progress = ProgressEvents(RunLog(tmp_path), start=6, total=10, every_s=10.0)
    clock[0] = 2.0
    progress.after(7, None)
    (event,) = [json.loads(line) for line in (tmp_path / EVENTS_FILE).read_text().splitlines()]
    assert event["data"]["step"] == 7 and event["data"]["eta_s"] == 6.0  # 2 s a step, 3 to go
    assert event["message"] == "step 7/10, about 6 s left"
