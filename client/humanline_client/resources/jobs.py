"""`client.jobs`: create, list, retrieve, cancel, events, metrics, checkpoints,
download_checkpoint, stream_events, wait, report."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional, Union, overload

import anyio

try:
    from typing import Literal
except ImportError:  # pragma: no cover
    from typing_extensions import Literal  # type: ignore[assignment]

from .._base_client import NOT_GIVEN, RequestOptions
from .._exceptions import JobWaitTimeout
from .._progress import ProgressDisplay, make_progress
from .._resource import AsyncAPIResource, SyncAPIResource, path_id, report_options
from .._streaming import DEFAULT_MAX_RECONNECTS, AsyncJobEventStream, JobEventStream
from ..pagination import AsyncPaginator, SyncPaginator
from ..types import (
    AdapterParams,
    Checkpoint,
    HumanlineParams,
    Job,
    JobEvent,
    JobReport,
    JobStatus,
    Metric,
    Objective,
    ObjectiveParams,
    OptimParams,
    ReportFormat,
    Variant,
)

__all__ = ["AsyncJobs", "Jobs"]

log = logging.getLogger("humanline_client")

PathLike = Union[str, "os.PathLike[str]"]
EventCallback = Callable[[JobEvent], Any]


def _job_body(
    *,
    base_model: str,
    training_file: str,
    objective: Union[Objective, str, ObjectiveParams, Mapping[str, Any]],
    extra_body: Optional[Mapping[str, Any]] = None,
    **fields: Any,
) -> dict[str, Any]:
    """The JobSpec to POST: only what the caller set (the server fills in the paper's
    defaults, and the idempotency hash covers exactly this)."""
    body: dict[str, Any] = {
        "base_model": base_model,
        "training_file": training_file,
        "objective": objective if isinstance(objective, str) else dict(objective),
    }
    for name, value in fields.items():
        if value is not None:
            body[name] = dict(value) if isinstance(value, Mapping) else value
    body.update(extra_body or {})
    return body


def _list_params(
    status: Optional[str], metadata: Optional[Mapping[str, str]], limit: int, after: Optional[str]
) -> dict[str, Any]:
    params: dict[str, Any] = {"status": status, "limit": limit, "after": after}
    for key, value in (metadata or {}).items():
        params[f"metadata[{key}]"] = value
    return params


def _report_path(job_id: str) -> str:
    return f"/v1/jobs/{path_id(job_id, 'job')}/report"


def _after_last_step(page: Any, params: dict[str, Any]) -> dict[str, Any]:
    params["from_step"] = page.data[-1].step + 1
    return params


class _Tracker:
    """What the progress bar shows, fed by polled job state, metrics and stream events."""

    def __init__(self, display: ProgressDisplay, job: Job) -> None:
        self.display = display
        self.step = job.current_step
        self.total = job.total_steps
        self.status = str(job.status)
        self.loss: Optional[float] = None
        self.next_metric_step = 0
        self.lock = threading.Lock()

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
        if event.kind != "metrics":
            self.display.note(f"[{event.seq}] {event.kind}: {event.message}")

    def render(self) -> None:
        with self.lock:
            step, total, loss, status = self.step, self.total, self.loss, self.status
        self.display.update(step=step, total=total, loss=loss, status=status)


class Jobs(SyncAPIResource):
    def create(
        self,
        *,
        base_model: str,
        training_file: str,
        objective: Union[Objective, ObjectiveParams],
        variant: Optional[Variant] = None,
        data_source: Optional[str] = None,
        humanline: Optional[bool] = None,
        humanline_params: Optional[HumanlineParams] = None,
        reference_sync: Optional[str] = None,
        length_normalize: Optional[bool] = None,
        optim: Optional[OptimParams] = None,
        batch_size: Optional[int] = None,
        grad_accum: Optional[int] = None,
        max_steps: Optional[int] = None,
        epochs: Optional[int] = None,
        max_prompt_length: Optional[int] = None,
        max_length: Optional[int] = None,
        seed: Optional[int] = None,
        precision: Optional[str] = None,
        adapter: Optional[AdapterParams] = None,
        checkpoint_every: Optional[int] = None,
        log_every: Optional[int] = None,
        quality_sample: Optional[int] = None,
        metadata: Optional[Mapping[str, str]] = None,
        extra_body: Optional[Mapping[str, Any]] = None,
        idempotency_key: Optional[str] = None,
        timeout: Any = NOT_GIVEN,
    ) -> Job:
        """Submit a training job. `objective` is "dpo" | "kto" | "grpo" or a dict with its
        hyperparameters ({"name": "dpo", "beta": 0.1}); `variant` is the shorthand
        "offline" | "offline+humanline" | ... for data_source and humanline. Unset fields
        take the server's defaults (the paper's). `extra_body` adds spec fields this SDK
        version does not know. Retries reuse one Idempotency-Key: one call, one job."""
        body = _job_body(
            base_model=base_model,
            training_file=training_file,
            objective=objective,
            extra_body=extra_body,
            variant=variant,
            data_source=data_source,
            humanline=humanline,
            humanline_params=humanline_params,
            reference_sync=reference_sync,
            length_normalize=length_normalize,
            optim=optim,
            batch_size=batch_size,
            grad_accum=grad_accum,
            max_steps=max_steps,
            epochs=epochs,
            max_prompt_length=max_prompt_length,
            max_length=max_length,
            seed=seed,
            precision=precision,
            adapter=adapter,
            checkpoint_every=checkpoint_every,
            log_every=log_every,
            quality_sample=quality_sample,
            metadata=metadata,
        )
        return self._client._call(
            Job,
            RequestOptions(
                "POST", "/v1/jobs", json=body, idempotency_key=idempotency_key, timeout=timeout
            ),
        )

    def list(
        self,
        *,
        status: Optional[Union[JobStatus, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        limit: int = 20,
        after: Optional[str] = None,
    ) -> SyncPaginator[Job]:
        """Jobs, newest first, optionally filtered by status and metadata values (all must
        match). Lazy: iterate, or `.first_page()`; `limit` is the page size."""
        return self._paginate("/v1/jobs", Job, _list_params(status, metadata, limit, after))

    def retrieve(self, job_id: str) -> Job:
        return self._client._get(f"/v1/jobs/{path_id(job_id, 'job')}", Job)

    def cancel(self, job_id: str, *, idempotency_key: Optional[str] = None) -> Job:
        """A queued job is cancelled at once; a running one becomes `cancelling` and stops at
        its next step boundary. ConflictError when the job has already finished."""
        return self._client._call(
            Job,
            RequestOptions(
                "POST",
                f"/v1/jobs/{path_id(job_id, 'job')}/cancel",
                idempotency_key=idempotency_key,
            ),
        )

    def events(self, job_id: str, *, after: int = 0, limit: int = 100) -> SyncPaginator[JobEvent]:
        """The job's event log, oldest first, after seq `after` (lazy pages of `limit`)."""
        return self._paginate(
            f"/v1/jobs/{path_id(job_id, 'job')}/events",
            JobEvent,
            {"after": after, "limit": limit},
        )

    def metrics(
        self,
        job_id: str,
        *,
        from_step: int = 0,
        to_step: Optional[int] = None,
        limit: int = 1000,
    ) -> SyncPaginator[Metric]:
        """Per-step training metrics, by step, from_step <= step <= to_step (lazy pages)."""
        return self._paginate(
            f"/v1/jobs/{path_id(job_id, 'job')}/metrics",
            Metric,
            {"from_step": from_step, "to_step": to_step, "limit": limit},
            _after_last_step,
        )

    def checkpoints(self, job_id: str) -> SyncPaginator[Checkpoint]:
        """Saved checkpoints, by step."""
        return self._paginate(f"/v1/jobs/{path_id(job_id, 'job')}/checkpoints", Checkpoint, {})

    def download_checkpoint(
        self, job_id: str, *, step: int, file: str, to: Optional[PathLike] = None
    ) -> Union[bytes, Path]:
        """One file of a checkpoint (a name from `Checkpoint.files`): its bytes, or streamed
        into `to` and that Path returned. Presigned object-store redirects are followed
        without sending the API key."""
        opts = RequestOptions(
            "GET",
            f"/v1/jobs/{path_id(job_id, 'job')}/checkpoints/{int(step)}/download",
            params={"file": file},
            headers={"Accept": "*/*"},
        )
        return self._client._download(opts, to)

    @overload
    def report(
        self, job_id: str, *, format: Literal["json"] = ..., to: None = ...
    ) -> JobReport: ...
    @overload
    def report(self, job_id: str, *, format: Literal["html"], to: None = ...) -> str: ...
    @overload
    def report(
        self, job_id: str, *, format: Union[ReportFormat, str] = ..., to: PathLike
    ) -> Path: ...
    def report(
        self,
        job_id: str,
        *,
        format: Union[ReportFormat, str] = "json",
        to: Optional[PathLike] = None,
    ) -> Union[JobReport, str, Path]:
        """The job's report, built on request (current while it runs): training curves, the
        data-quality histogram, its evaluations and the manifest (spec, data sha256, code
        version, seed, wall-clock per phase). A JobReport (`format="json"`), the
        self-contained HTML page as a str (`format="html"`), or with `to=` written to that
        file and its Path returned."""
        return self._report(report_options(_report_path(job_id), format), format, JobReport, to)

    def stream_events(
        self, job_id: str, *, after: int = 0, max_reconnects: int = DEFAULT_MAX_RECONNECTS
    ) -> JobEventStream:
        """Follow the job's events live until it finishes (server-sent events, resumed with
        Last-Event-ID after a dropped connection). `stream.status` is the final status."""
        return JobEventStream(
            self._client,
            job_id,
            f"/v1/jobs/{path_id(job_id, 'job')}/events/stream",
            after=after,
            max_reconnects=max_reconnects,
        )

    def wait(
        self,
        job_id: str,
        *,
        timeout: Optional[float] = None,
        progress: Optional[bool] = None,
        on_event: Optional[EventCallback] = None,
        poll_interval: float = 2.0,
    ) -> Job:
        """Block until the job succeeds, fails or is cancelled, and return it (check
        `job.status`). Follows the event stream (`on_event` sees every event, oldest first);
        `progress` shows steps, loss and ETA (default: when stderr is a terminal), polled
        every `poll_interval` seconds. Raises JobWaitTimeout after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        job = self.retrieve(job_id)
        display = make_progress(progress, job.id) if not job.is_terminal or progress else None
        tracker = _Tracker(display, job) if display is not None else None
        stop = threading.Event()
        poller: Optional[threading.Thread] = None
        if tracker is not None:
            poller = threading.Thread(
                target=self._poll_progress,
                args=(job_id, tracker, stop, poll_interval),
                name=f"humanline-progress-{job_id}",
                daemon=True,
            )
            poller.start()
        try:
            if not job.is_terminal:
                stream = JobEventStream(
                    self._client,
                    job_id,
                    f"/v1/jobs/{path_id(job_id, 'job')}/events/stream",
                    deadline=deadline,
                )
                with stream:
                    for event in stream:
                        if tracker is not None:
                            tracker.event(event)
                            tracker.render()
                        if on_event is not None:
                            on_event(event)
            elif on_event is not None:
                for event in self.events(job_id, limit=1000):
                    on_event(event)
            job = self.retrieve(job_id)
        except JobWaitTimeout as exc:
            try:
                exc.job = self.retrieve(job_id)
            except Exception:  # noqa: BLE001 - the timeout is the error worth raising
                exc.job = job
            raise
        finally:
            stop.set()
            if poller is not None:
                poller.join(timeout=poll_interval + 5)
            if tracker is not None:
                self._refresh(job_id, tracker, job)
                tracker.render()
                tracker.display.close()
        return job

    def _refresh(self, job_id: str, tracker: _Tracker, job: Optional[Job] = None) -> None:
        try:
            tracker.job(job or self.retrieve(job_id))
            tracker.metrics(self.metrics(job_id, from_step=tracker.next_metric_step))
        except Exception:  # a progress bar never breaks a wait
            log.debug("progress refresh of %s failed", job_id, exc_info=True)

    def _poll_progress(
        self, job_id: str, tracker: _Tracker, stop: threading.Event, interval: float
    ) -> None:
        while not stop.is_set():
            self._refresh(job_id, tracker)
            tracker.render()
            stop.wait(interval)


class AsyncJobs(AsyncAPIResource):
    async def create(
        self,
        *,
        base_model: str,
        training_file: str,
        objective: Union[Objective, ObjectiveParams],
        variant: Optional[Variant] = None,
        data_source: Optional[str] = None,
        humanline: Optional[bool] = None,
        humanline_params: Optional[HumanlineParams] = None,
        reference_sync: Optional[str] = None,
        length_normalize: Optional[bool] = None,
        optim: Optional[OptimParams] = None,
        batch_size: Optional[int] = None,
        grad_accum: Optional[int] = None,
        max_steps: Optional[int] = None,
        epochs: Optional[int] = None,
        max_prompt_length: Optional[int] = None,
        max_length: Optional[int] = None,
        seed: Optional[int] = None,
        precision: Optional[str] = None,
        adapter: Optional[AdapterParams] = None,
        checkpoint_every: Optional[int] = None,
        log_every: Optional[int] = None,
        quality_sample: Optional[int] = None,
        metadata: Optional[Mapping[str, str]] = None,
        extra_body: Optional[Mapping[str, Any]] = None,
        idempotency_key: Optional[str] = None,
        timeout: Any = NOT_GIVEN,
    ) -> Job:
        body = _job_body(
            base_model=base_model,
            training_file=training_file,
            objective=objective,
            extra_body=extra_body,
            variant=variant,
            data_source=data_source,
            humanline=humanline,
            humanline_params=humanline_params,
            reference_sync=reference_sync,
            length_normalize=length_normalize,
            optim=optim,
            batch_size=batch_size,
            grad_accum=grad_accum,
            max_steps=max_steps,
            epochs=epochs,
            max_prompt_length=max_prompt_length,
            max_length=max_length,
            seed=seed,
            precision=precision,
            adapter=adapter,
            checkpoint_every=checkpoint_every,
            log_every=log_every,
            quality_sample=quality_sample,
            metadata=metadata,
        )
        return await self._client._call(
            Job,
            RequestOptions(
                "POST", "/v1/jobs", json=body, idempotency_key=idempotency_key, timeout=timeout
            ),
        )

    def list(
        self,
        *,
        status: Optional[Union[JobStatus, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        limit: int = 20,
        after: Optional[str] = None,
    ) -> AsyncPaginator[Job]:
        return self._paginate("/v1/jobs", Job, _list_params(status, metadata, limit, after))

    async def retrieve(self, job_id: str) -> Job:
        return await self._client._get(f"/v1/jobs/{path_id(job_id, 'job')}", Job)

    async def cancel(self, job_id: str, *, idempotency_key: Optional[str] = None) -> Job:
        return await self._client._call(
            Job,
            RequestOptions(
                "POST",
                f"/v1/jobs/{path_id(job_id, 'job')}/cancel",
                idempotency_key=idempotency_key,
            ),
        )

    def events(self, job_id: str, *, after: int = 0, limit: int = 100) -> AsyncPaginator[JobEvent]:
        return self._paginate(
            f"/v1/jobs/{path_id(job_id, 'job')}/events",
            JobEvent,
            {"after": after, "limit": limit},
        )

    def metrics(
        self,
        job_id: str,
        *,
        from_step: int = 0,
        to_step: Optional[int] = None,
        limit: int = 1000,
    ) -> AsyncPaginator[Metric]:
        return self._paginate(
            f"/v1/jobs/{path_id(job_id, 'job')}/metrics",
            Metric,
            {"from_step": from_step, "to_step": to_step, "limit": limit},
            _after_last_step,
        )

    def checkpoints(self, job_id: str) -> AsyncPaginator[Checkpoint]:
        return self._paginate(f"/v1/jobs/{path_id(job_id, 'job')}/checkpoints", Checkpoint, {})

    async def download_checkpoint(
        self, job_id: str, *, step: int, file: str, to: Optional[PathLike] = None
    ) -> Union[bytes, Path]:
        opts = RequestOptions(
            "GET",
            f"/v1/jobs/{path_id(job_id, 'job')}/checkpoints/{int(step)}/download",
            params={"file": file},
            headers={"Accept": "*/*"},
        )
        return await self._client._download(opts, to)

    @overload
    async def report(
        self, job_id: str, *, format: Literal["json"] = ..., to: None = ...
    ) -> JobReport: ...
    @overload
    async def report(self, job_id: str, *, format: Literal["html"], to: None = ...) -> str: ...
    @overload
    async def report(
        self, job_id: str, *, format: Union[ReportFormat, str] = ..., to: PathLike
    ) -> Path: ...
    async def report(
        self,
        job_id: str,
        *,
        format: Union[ReportFormat, str] = "json",
        to: Optional[PathLike] = None,
    ) -> Union[JobReport, str, Path]:
        """See Jobs.report."""
        opts = report_options(_report_path(job_id), format)
        return await self._report(opts, format, JobReport, to)

    def stream_events(
        self, job_id: str, *, after: int = 0, max_reconnects: int = DEFAULT_MAX_RECONNECTS
    ) -> AsyncJobEventStream:
        return AsyncJobEventStream(
            self._client,
            job_id,
            f"/v1/jobs/{path_id(job_id, 'job')}/events/stream",
            after=after,
            max_reconnects=max_reconnects,
        )

    async def wait(
        self,
        job_id: str,
        *,
        timeout: Optional[float] = None,
        progress: Optional[bool] = None,
        on_event: Optional[EventCallback] = None,
        poll_interval: float = 2.0,
    ) -> Job:
        """See Jobs.wait; `on_event` may be a plain function or a coroutine function."""
        deadline = None if timeout is None else time.monotonic() + timeout
        job = await self.retrieve(job_id)
        display = make_progress(progress, job.id) if not job.is_terminal or progress else None
        tracker = _Tracker(display, job) if display is not None else None

        async def call(event: JobEvent) -> None:
            if on_event is not None:
                result = on_event(event)
                if hasattr(result, "__await__"):
                    await result

        async def follow() -> None:
            if not job.is_terminal:
                stream = AsyncJobEventStream(
                    self._client,
                    job_id,
                    f"/v1/jobs/{path_id(job_id, 'job')}/events/stream",
                    deadline=deadline,
                )
                async with stream:
                    async for event in stream:
                        if tracker is not None:
                            tracker.event(event)
                            tracker.render()
                        await call(event)
            elif on_event is not None:
                async for event in self.events(job_id, limit=1000):
                    await call(event)

        try:
            if tracker is None:
                await follow()
            else:
                # The poller runs beside the stream; errors of the stream are carried out of
                # the task group by hand so they are not wrapped in an ExceptionGroup.
                error: Optional[Exception] = None
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._poll_progress, job_id, tracker, poll_interval)
                    try:
                        await follow()
                    except Exception as exc:  # noqa: BLE001 - re-raised below
                        error = exc
                    tasks.cancel_scope.cancel()
                if error is not None:
                    raise error
            job = await self.retrieve(job_id)
        except JobWaitTimeout as exc:
            try:
                exc.job = await self.retrieve(job_id)
            except Exception:  # noqa: BLE001
                exc.job = job
            raise
        finally:
            if tracker is not None:
                await self._refresh(job_id, tracker, job)
                tracker.render()
                tracker.display.close()
        return job

    async def _refresh(self, job_id: str, tracker: _Tracker, job: Optional[Job] = None) -> None:
        try:
            tracker.job(job or await self.retrieve(job_id))
            tracker.metrics(
                await self.metrics(job_id, from_step=tracker.next_metric_step).to_list()
            )
        except Exception:  # a progress bar never breaks a wait
            log.debug("progress refresh of %s failed", job_id, exc_info=True)

    async def _poll_progress(self, job_id: str, tracker: _Tracker, interval: float) -> None:
        while True:
            await self._refresh(job_id, tracker)
            tracker.render()
            await anyio.sleep(interval)
