"""The run's outputs as files, the trainer's only interface to whoever runs it.

`metrics.jsonl` gets one line per logged step, `events.jsonl` one per event; both are appended
and flushed line by line so a watcher (the worker) can tail them while training runs and a
crash loses at most the line being written. A `STOP` file dropped into the run directory asks
the trainer to checkpoint and stop at the next step boundary.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from contract.runs import EVENTS_FILE, METRICS_FILE, STOP_FILE


class RunLog:
    def __init__(self, out_dir: Path, enabled: bool = True):
        self.out_dir = Path(out_dir)
        self.enabled = enabled

    def _append(self, name: str, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.out_dir / name, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, default=float) + "\n")

    def event(self, kind: str, message: str, **data: Any) -> None:
        self._append(
            EVENTS_FILE, {"time": time.time(), "kind": kind, "message": message, "data": data}
        )

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self._append(METRICS_FILE, {"step": step, "time": time.time(), **values})

    def write_json(self, name: str, obj: Any) -> None:
        if self.enabled:
            tmp = self.out_dir / (name + ".tmp")
            tmp.write_text(json.dumps(obj, indent=2, default=float))
            tmp.replace(self.out_dir / name)

    def truncate_metrics(self, last_step: int) -> None:
        """On resume, forget steps logged after the checkpoint we restart from."""
        path = self.out_dir / METRICS_FILE
        if not self.enabled or not path.exists():
            return
        keep = [
            ln
            for ln in path.read_text().splitlines()
            if ln.strip() and json.loads(ln)["step"] <= last_step
        ]
        path.write_text("".join(ln + "\n" for ln in keep))

    def stop_requested(self) -> bool:
        return (self.out_dir / STOP_FILE).exists()


PROGRESS_EVERY_S = 10.0  # at most one `progress` event per this many seconds (each is a DB row)


class ProgressEvents:
    """Throttled `progress` events while training (phase, step, total_steps, loss, eta_s), so
    a follower sees the run move between `started` and the first checkpoint. The first step
    after a (re)start and the last step always report."""

    def __init__(self, log: RunLog, start: int, total: int, every_s: float = PROGRESS_EVERY_S):
        self.log, self.start, self.total, self.every_s = log, start, total, every_s
        self.t0 = time.monotonic()
        self.last: float | None = None

    def after(self, step: int, loss: float | None) -> None:
        now = time.monotonic()
        if self.last is not None and now - self.last < self.every_s and step != self.total:
            return
        self.last = now
        done = step - self.start
        eta = (now - self.t0) / done * (self.total - step) if done > 0 else None
        loss_text = f", loss {loss:.4f}" if loss is not None else ""
        self.log.event(
            "progress",
            f"step {step}/{self.total}{loss_text}" + (f", about {eta:.0f} s left" if eta else ""),
            phase="training",
            step=step,
            total_steps=self.total,
            loss=loss,
            eta_s=round(eta, 1) if eta is not None else None,
        )
