"""The progress display of `jobs.wait` (steps, loss, ETA, and the phase a job is in before
its first step: loading the model, scoring data quality). On a terminal a bar: rich if
installed, else tqdm, else plain lines. Elsewhere (CI logs, `nohup`, a pipe) plain log lines,
at most one every LOG_EVERY seconds, and only when asked for (`progress=True`)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import IO, Any, Optional


def _fmt_loss(loss: Optional[float]) -> str:
    return "-" if loss is None else f"{loss:.4f}"


def _fmt_eta(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


LOG_EVERY = 10.0  # seconds between plain log lines when not on a terminal


@dataclass(frozen=True)
class ProgressState:
    """What a display shows: the step of `total`, the last loss, the job's status, the
    phase it is in (loading_model, scoring_data, training...) and the server's ETA."""

    step: int = 0
    total: Optional[int] = None
    loss: Optional[float] = None
    status: str = "queued"
    phase: Optional[str] = None
    eta: Optional[float] = None

    @property
    def description(self) -> str:
        """`running (loading model)`: what a job does before its first step."""
        phase = self.phase
        if phase and phase != "training":
            return f"{self.status} ({phase.replace('_', ' ')})"
        return self.status


class ProgressDisplay:
    """What `wait` drives; `update` may be called from a background thread."""

    def __init__(self, job_id: str, file: IO[str]) -> None:
        self.job_id = job_id
        self.file = file

    def update(self, state: ProgressState) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def note(self, text: str) -> None:
        print(text, file=self.file, flush=True)

    def close(self) -> None:
        pass


class PlainProgress(ProgressDisplay):
    """No rich, no tqdm: one line per change, at most every `every` seconds."""

    def __init__(self, job_id: str, file: IO[str], every: float = 5.0) -> None:
        super().__init__(job_id, file)
        self.every = every
        self._last_print = 0.0
        self._last_line = ""
        self._first: Optional[tuple[float, int]] = None  # (time, step) of the first step seen
        self._pending = ""

    def line(self, state: ProgressState) -> str:
        step, total, eta = state.step, state.total, state.eta
        now = time.monotonic()
        if self._first is None and step > 0:
            self._first = (now, step)
        if eta is None and self._first is not None and total and step > self._first[1]:
            rate = (step - self._first[1]) / (now - self._first[0])
            eta = (total - step) / rate if rate > 0 else None
        of = f"/{total}" if total else ""
        return (
            f"{self.job_id} {state.description}: step {step}{of}, "
            f"loss {_fmt_loss(state.loss)}, ETA {_fmt_eta(eta)}"
        )

    def update(self, state: ProgressState) -> None:
        text = self.line(state)
        now = time.monotonic()
        if text != self._last_line and (
            now - self._last_print >= self.every or not self._last_line
        ):
            self._last_line, self._last_print = text, now
            print(text, file=self.file, flush=True)
        self._pending = text

    def close(self) -> None:
        if self._pending and self._pending != self._last_line:
            print(self._pending, file=self.file, flush=True)


class RichProgress(ProgressDisplay):
    def __init__(self, job_id: str, file: IO[str]) -> None:
        super().__init__(job_id, file)
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(file=file),
        )
        self._task = self._progress.add_task(f"{job_id} queued", total=None, loss="-")
        self._progress.start()

    def update(self, state: ProgressState) -> None:
        self._progress.update(
            self._task,
            completed=state.step,
            total=state.total,
            loss=_fmt_loss(state.loss),
            description=f"{self.job_id} {state.description}",
        )

    def note(self, text: str) -> None:
        self._progress.console.print(text, markup=False, highlight=False)

    def close(self) -> None:
        self._progress.stop()


class TqdmProgress(ProgressDisplay):
    def __init__(self, job_id: str, file: IO[str]) -> None:
        super().__init__(job_id, file)
        from tqdm import tqdm  # type: ignore[import-untyped]

        self._tqdm = tqdm
        self._bar = tqdm(total=None, desc=job_id, unit="step", file=file, dynamic_ncols=True)

    def update(self, state: ProgressState) -> None:
        if state.total and self._bar.total != state.total:
            self._bar.total = state.total
        self._bar.n = state.step
        self._bar.set_postfix_str(
            f"{state.description}, loss {_fmt_loss(state.loss)}", refresh=False
        )
        self._bar.refresh()

    def note(self, text: str) -> None:
        self._tqdm.write(text, file=self.file)

    def close(self) -> None:
        self._bar.close()


def make_progress(
    enabled: Optional[bool],
    job_id: str,
    *,
    file: Optional[IO[str]] = None,
    kind: Optional[str] = None,
) -> Optional[ProgressDisplay]:
    """None when disabled. `enabled=None`: a bar when `file` (stderr) is a terminal, else
    nothing; `enabled=True`: a bar on a terminal, else plain log lines (one every LOG_EVERY
    seconds at most). `kind` forces "rich", "tqdm" or "plain"."""
    out: Any = file if file is not None else sys.stderr
    try:
        terminal = bool(out.isatty())
    except (AttributeError, ValueError):
        terminal = False
    if enabled is None:
        enabled = terminal
    if not enabled:
        return None
    if kind is None and not terminal:
        return PlainProgress(job_id, out, every=LOG_EVERY)
    for name in [kind] if kind else ["rich", "tqdm"]:
        try:
            if name == "rich":
                return RichProgress(job_id, out)
            if name == "tqdm":
                return TqdmProgress(job_id, out)
        except ImportError:
            continue
    return PlainProgress(job_id, out)
