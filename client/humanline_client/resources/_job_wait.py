"""`jobs.wait`: follow a job's event stream to its end while a poller feeds the progress
display with the job's step and metrics. The stream and the poller run side by side, in a
thread (Client) or a task group (AsyncClient); everything else is shared here. Below
resources.jobs: what a wait needs of `client.jobs` is the protocols Jobs and AsyncJobs."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import anyio
from typing_extensions import Protocol

from .._exceptions import JobWaitTimeout
from .._progress import ProgressDisplay, ProgressState, make_progress
from .._steps import Steps
from ..types import Job, JobEvent, Metric

log = logging.getLogger("humanline_client")
EventCallback = Callable[[JobEvent], Any]


class _Resource(Protocol):
    _client: Any

    def _stream(self, job_id: str, **options: Any) -> Any: ...
    def _poll_steps(self, job_id: str, from_step: int) -> Steps[tuple[Job, Sequence[Metric]]]: ...


class Jobs(_Resource, Protocol):
    """What wait_sync needs of resources.jobs.Jobs."""

    def retrieve(self, job_id: str) -> Job: ...
    def events(self, job_id: str, *, limit: int) -> Iterable[JobEvent]: ...


class AsyncJobs(_Resource, Protocol):
    """What wait_async needs of resources.jobs.AsyncJobs."""

    async def retrieve(self, job_id: str) -> Job: ...
    def events(self, job_id: str, *, limit: int) -> AsyncIterable[JobEvent]: ...


class Tracker:
    """What the progress display shows, fed by polled job state, metrics and stream events
    (per-step `progress` events carry phase, step, total_steps, loss and eta_s)."""

    def __init__(self, display: ProgressDisplay, job: Job) -> None:
        self.display = display
        self.step = job.current_step
        self.total = job.total_steps
        self.status = str(job.status)
        self.loss: Optional[float] = None
        self.phase: Optional[str] = None
        self.eta: Optional[float] = None
        self.next_metric_step = 0
        self.lock = threading.Lock()

    @classmethod
    def start(cls, job: Job, progress: Any) -> Optional[Tracker]:
        if job.is_terminal and not progress:
            return None
        display = make_progress(progress, job.id)
        return None if display is None else cls(display, job)

    def job(self, job: Job) -> None:
        with self.lock:
            self.status = str(job.status)
            self.step = max(self.step, job.current_step)
            self.total = job.total_steps or self.total

    def metrics(self, metrics: Any) -> None:
        with self.lock:
            for metric in metrics:
                self.next_metric_step = max(self.next_metric_step, metric.step + 1)
                self.step = max(self.step, metric.step)
                loss = metric.values.get("loss")
                if isinstance(loss, (int, float)):
                    self.loss = float(loss)

    def event(self, event: JobEvent) -> None:
        data = event.data or {}
        with self.lock:
            if event.kind == "status" and isinstance(data.get("to"), str):
                self.status = data["to"]
            if isinstance(data.get("step"), int):
                self.step = max(self.step, data["step"])
            if isinstance(data.get("total_steps"), int):
                self.total = data["total_steps"]
            if isinstance(data.get("loss"), (int, float)):
                self.loss = float(data["loss"])
            if event.kind == "progress":
                self.phase = data.get("phase") if isinstance(data.get("phase"), str) else None
                eta = data.get("eta_s")
                self.eta = float(eta) if isinstance(eta, (int, float)) else None
        if event.kind not in ("metrics", "progress"):  # those move the bar, not the log
            self.display.note(f"[{event.seq}] {event.kind}: {event.message}")
        self.render()

    def render(self) -> None:
        with self.lock:
            state = ProgressState(
                self.step, self.total, self.loss, self.status, self.phase, self.eta
            )
        self.display.update(state)


def _refresh_steps(jobs: Any, job_id: str, tracker: Tracker) -> Steps[None]:
    """Poll the job's step and its new metrics into the tracker; a failure is logged, never
    raised (a progress display never breaks a wait)."""
    try:
        job, metrics = yield from jobs._poll_steps(job_id, tracker.next_metric_step)
        tracker.job(job)
        tracker.metrics(metrics)
    except Exception:
        log.debug("progress refresh of %s failed", job_id, exc_info=True)
    tracker.render()


def _timed_out(exc: JobWaitTimeout, fetch: Callable[[], Job], job: Job) -> None:
    try:
        exc.job = fetch()
    except Exception:  # noqa: BLE001 - the timeout is the error worth raising
        exc.job = job


@dataclass(frozen=True)
class Wait:
    """The options of one `wait` call; `deadline` is when it gives up (monotonic clock)."""

    timeout: Optional[float]
    progress: Optional[bool]
    on_event: Optional[EventCallback]
    poll_interval: float
    deadline: Optional[float] = field(init=False)

    def __post_init__(self) -> None:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        object.__setattr__(self, "deadline", deadline)


def wait_sync(jobs: Jobs, job_id: str, **arguments: Any) -> Job:
    options = Wait(**arguments)
    on_event, poll_interval = options.on_event, options.poll_interval
    job = jobs.retrieve(job_id)
    tracker = Tracker.start(job, options.progress)
    stop = threading.Event()

    def refresh() -> None:
        if tracker is not None:
            jobs._client._run(_refresh_steps(jobs, job_id, tracker))

    def poll() -> None:
        while True:
            refresh()
            if stop.wait(poll_interval):
                return

    def handle(event: JobEvent) -> None:
        if tracker is not None:
            tracker.event(event)
        if on_event is not None:
            on_event(event)

    poller = threading.Thread(target=poll, name=f"humanline-progress-{job_id}", daemon=True)
    if tracker is not None:
        poller.start()
    try:
        if not job.is_terminal:
            with jobs._stream(job_id, deadline=options.deadline) as stream:
                for event in stream:
                    handle(event)
        elif on_event is not None:
            for event in jobs.events(job_id, limit=1000):
                on_event(event)
        job = jobs.retrieve(job_id)
    except JobWaitTimeout as exc:
        _timed_out(exc, lambda: jobs.retrieve(job_id), job)
        raise
    finally:
        stop.set()
        if poller.is_alive():
            poller.join(timeout=poll_interval + 5)
        if tracker is not None:
            refresh()
            tracker.display.close()
    return job


async def wait_async(jobs: AsyncJobs, job_id: str, **arguments: Any) -> Job:
    options = Wait(**arguments)
    job = await jobs.retrieve(job_id)
    tracker = Tracker.start(job, options.progress)
    on_event = options.on_event

    async def refresh() -> None:
        if tracker is not None:
            await jobs._client._run(_refresh_steps(jobs, job_id, tracker))

    async def handle(event: JobEvent) -> None:
        if tracker is not None:
            tracker.event(event)
        if on_event is not None:
            result = on_event(event)
            if hasattr(result, "__await__"):
                await result

    async def follow() -> None:
        if not job.is_terminal:
            async with jobs._stream(job_id, deadline=options.deadline) as stream:
                async for event in stream:
                    await handle(event)
        elif on_event is not None:
            async for event in jobs.events(job_id, limit=1000):
                await handle(event)

    async def poll() -> None:
        while True:
            await refresh()
            await anyio.sleep(options.poll_interval)

    try:
        # The poller runs beside the stream; an error of the stream is carried out of the
        # task group by hand so that it is not wrapped in an ExceptionGroup.
        error: Optional[Exception] = None
        async with anyio.create_task_group() as tasks:
            if tracker is not None:
                tasks.start_soon(poll)
            try:
                await follow()
            except Exception as exc:  # noqa: BLE001 - re-raised below
                error = exc
            tasks.cancel_scope.cancel()
        if error is not None:
            raise error
        job = await jobs.retrieve(job_id)
    except JobWaitTimeout as exc:
        exc.job = job
        with contextlib.suppress(Exception):  # the timeout is the error worth raising
            exc.job = await jobs.retrieve(job_id)
        raise
    finally:
        if tracker is not None:
            await refresh()
            tracker.display.close()
    return job
