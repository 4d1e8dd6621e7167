"""`client.jobs`: create, estimate, list, retrieve, cancel, events, metrics, checkpoints,
download_checkpoint, download_model, stream_events, wait, report."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Optional, Union

from .._exceptions import HumanlineError
from .._methods import AsyncReport, SyncReport, endpoint, paged, report_endpoint, twin
from .._resource import (
    APIResource,
    AsyncAPIResource,
    Listing,
    SyncAPIResource,
    page_steps,
    path_id,
)
from .._retries import NOT_GIVEN, RequestOptions
from .._steps import Callback, Steps
from .._streaming import DEFAULT_MAX_RECONNECTS, AsyncJobEventStream, JobEventStream
from ..types import (
    AdapterParams,
    BaseModel,
    Checkpoint,
    EvaluationParams,
    HumanlineParams,
    Job,
    JobEstimate,
    JobEvent,
    JobReport,
    JobStatus,
    Metric,
    Objective,
    ObjectiveParams,
    OnlineParams,
    OptimParams,
    ParallelParams,
    Variant,
)
from ._downloads import FileDownload, Progress, reporter, target_path
from ._job_wait import EventCallback, wait_async, wait_sync

__all__ = ["AsyncJobs", "FileDownload", "Jobs"]

PathLike = Union[str, "os.PathLike[str]"]
INTERNAL_MARKERS = ("_COMPLETE",)  # written by the worker beside checkpoints: never data


def _job_path(job_id: str, *rest: str) -> str:
    return "/".join([f"/v1/jobs/{path_id(job_id, 'job')}", *rest])


def _after_last_step(page: Any, params: dict[str, Any]) -> dict[str, Any]:
    params["from_step"] = page.data[-1].step + 1
    return params


class _Jobs(APIResource):
    @endpoint
    def create(
        self,
        *,
        base_model: str,
        training_file: str,
        objective: Union[Objective, ObjectiveParams],
        variant: Optional[Variant] = None,
        preset: Optional[str] = None,
        data_source: Optional[str] = None,
        humanline: Optional[bool] = None,
        online: Optional[OnlineParams] = None,
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
        evaluations: Optional[list[EvaluationParams]] = None,
        max_runtime: Optional[float] = None,
        log_every: Optional[int] = None,
        quality_sample: Optional[int] = None,
        metadata: Optional[Mapping[str, str]] = None,
        activation_checkpointing: Optional[str] = None,
        compile: Optional[str] = None,
        parallelism: Optional[ParallelParams] = None,
        extra_body: Optional[Mapping[str, Any]] = None,
        idempotency_key: Optional[str] = None,
        timeout: Any = NOT_GIVEN,
    ) -> Steps[Job]:
        """Submit a training job: every keyword but the last three is a JobSpec field
        (tests/client/test_spec_keywords.py holds them against the spec's JSON schema).
        `objective` is "sft" | "dpo" | "kto" | "grpo" or a dict with its hyperparameters
        ({"name": "dpo", "beta": 0.1}); `variant` is the shorthand "offline" |
        "offline+humanline" | "online" | "online+humanline" for data_source and humanline;
        `online` sets sampling and rewards of online jobs; `evaluations` run on the final
        model when the job succeeds; `preset` ("instruction" | "math") is the paper's testbed
        whose defaults fill unset fields. Unset fields take the server's defaults (the paper's;
        the job returned shows every resolved value).
        `extra_body` adds spec fields this SDK version does not know. Retries reuse one
        Idempotency-Key: one call, one job."""
        opts = RequestOptions(
            "POST",
            "/v1/jobs",
            json=self._create_body(locals()),  # the keywords: no other local yet
            idempotency_key=idempotency_key,
            timeout=timeout,
        )
        return (yield from self._call(Job, opts))

    @endpoint
    def estimate(
        self,
        *,
        base_model: str,
        training_file: str,
        objective: Union[Objective, ObjectiveParams],
        variant: Optional[Variant] = None,
        preset: Optional[str] = None,
        data_source: Optional[str] = None,
        humanline: Optional[bool] = None,
        online: Optional[OnlineParams] = None,
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
        evaluations: Optional[list[EvaluationParams]] = None,
        max_runtime: Optional[float] = None,
        log_every: Optional[int] = None,
        quality_sample: Optional[int] = None,
        metadata: Optional[Mapping[str, str]] = None,
        activation_checkpointing: Optional[str] = None,
        compile: Optional[str] = None,
        parallelism: Optional[ParallelParams] = None,
        extra_body: Optional[Mapping[str, Any]] = None,
        timeout: Any = NOT_GIVEN,
    ) -> Steps[JobEstimate]:
        """What a job would cost, before creating it: the same keywords, body and errors as
        `create` (a bad spec raises the same exception), but nothing is created. Returns the
        resolved spec, the micro-batch, steps, training tokens (approximated from the file's
        size: `tokens_method`), memory per process, GPUs, and the predicted wall-clock and
        GPU-hours on the server's job queue."""
        opts = RequestOptions(
            "POST",
            "/v1/jobs/estimate",
            json=self._create_body(locals()),  # the keywords: no other local yet
            timeout=timeout,
        )
        return (yield from self._call(JobEstimate, opts))

    @paged
    def list(
        self,
        *,
        status: Optional[Union[JobStatus, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        limit: int = 20,
        after: Optional[str] = None,
    ) -> Listing[Job]:
        """Jobs, newest first, optionally filtered by status and metadata values (all must
        match). Lazy: iterate, or `.first_page()`; `limit` is the page size."""
        params: dict[str, Any] = {"status": status, "limit": limit, "after": after}
        for key, value in (metadata or {}).items():
            params[f"metadata[{key}]"] = value
        return Listing("/v1/jobs", Job, params)

    @endpoint
    def retrieve(self, job_id: str) -> Steps[Job]:
        return (yield from self._get(_job_path(job_id), Job))

    @endpoint
    def cancel(self, job_id: str, *, idempotency_key: Optional[str] = None) -> Steps[Job]:
        """A queued job is cancelled at once; a running one becomes `cancelling` and stops at
        its next step boundary. ConflictError when the job has already finished."""
        opts = RequestOptions("POST", _job_path(job_id, "cancel"), idempotency_key=idempotency_key)
        return (yield from self._call(Job, opts))

    @paged
    def events(self, job_id: str, *, after: int = 0, limit: int = 100) -> Listing[JobEvent]:
        """The job's event log, oldest first, after seq `after` (lazy pages of `limit`)."""
        return Listing(_job_path(job_id, "events"), JobEvent, {"after": after, "limit": limit})

    @paged
    def metrics(
        self, job_id: str, *, from_step: int = 0, to_step: Optional[int] = None, limit: int = 1000
    ) -> Listing[Metric]:
        """Per-step training metrics, by step, from_step <= step <= to_step (lazy pages)."""
        params = {"from_step": from_step, "to_step": to_step, "limit": limit}
        return Listing(_job_path(job_id, "metrics"), Metric, params, _after_last_step)

    @paged
    def checkpoints(self, job_id: str) -> Listing[Checkpoint]:
        """Saved checkpoints, by step."""
        return Listing(_job_path(job_id, "checkpoints"), Checkpoint)

    @endpoint
    def download_checkpoint(
        self,
        job_id: str,
        *,
        step: int,
        file: Optional[str] = None,
        to: Optional[PathLike] = None,
        progress: Progress = None,
    ) -> Steps[Union[bytes, Path]]:
        """One file of a checkpoint (a name from `Checkpoint.files`): its bytes, or streamed
        into `to` and that Path returned. Without `file`, the whole checkpoint (training
        state: weights, optimizer, RNG; resume material, not a model to load — that is
        `download_model`) into the directory `to`, returned as its Path; `progress` as in
        download_model. Presigned object-store redirects are followed without sending the
        API key."""
        path = _job_path(job_id, "checkpoints", str(int(step)), "download")
        if file is not None:
            return (yield from self._download(_file_options(path, file), to))
        if to is None:
            raise ValueError("name the directory to download the checkpoint into: to=DIR")
        listing = yield from self._call(
            _CheckpointPage, RequestOptions("GET", _job_path(job_id, "checkpoints"))
        )
        found = [c for c in listing.data if c.step == int(step)]
        if not found:
            steps = ", ".join(str(c.step) for c in listing.data) or "none yet"
            raise HumanlineError(f"job {job_id} has no checkpoint at step {step} (steps: {steps})")
        return (yield from self._save_all(path, found[0].files or [], to, progress))

    @endpoint
    def download_model(
        self, job_id: str, dir: PathLike, *, progress: Progress = None
    ) -> Steps[Path]:
        """Download the job's exported model (an adapter or full model directory that
        transformers/peft load) into `dir`, every file, and return its Path. `progress`:
        None prints a line per file on stderr when it is a terminal, True always, False
        never, or a callable that receives each FileDownload. HumanlineError unless the
        job has succeeded with an exported model."""
        job = yield from _Jobs.retrieve.steps(self, job_id)
        if job.status != "succeeded" or not job.model_files:
            raise HumanlineError(
                f"job {job.id} has no exported model (status {job.status}); a model is "
                "exported when a job succeeds"
            )
        return (
            yield from self._save_all(
                _job_path(job_id, "model", "download"), job.model_files, dir, progress
            )
        )

    @twin.of(wait_sync, wait_async)
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
        `progress` shows step, loss and ETA, polled every `poll_interval` seconds: None (the
        default) a bar when stderr is a terminal and nothing otherwise, True a bar on a
        terminal and plain log lines otherwise (CI logs), False nothing. Raises
        JobWaitTimeout after `timeout` seconds (the job goes on). On AsyncClient `on_event`
        may be a coroutine function."""
        raise NotImplementedError  # pragma: no cover - see wait_sync and wait_async

    def _poll_steps(self, job_id: str, from_step: int) -> Steps[tuple[Job, Sequence[Metric]]]:
        """What a wait's progress display polls (_job_wait): the job, its metrics from
        `from_step` on (one page)."""
        job = yield from _Jobs.retrieve.steps(self, job_id)
        listing = _Jobs.metrics.describe(self, job_id, from_step=from_step)
        page = yield from page_steps(self._client, listing, listing.params)
        return job, page["data"]

    _stream_class: Any

    def _stream(self, job_id: str, **options: Any) -> Any:  # typed by the twins' callers
        """The job's event stream (JobEventStream or AsyncJobEventStream)."""
        path = _job_path(job_id, "events", "stream")
        return self._stream_class(self._client, job_id, path, **options)

    def _save_all(
        self, path: str, names: Sequence[str], to: PathLike, progress: Progress
    ) -> Steps[Path]:
        dest = Path(to)
        names = [n for n in names if PurePosixPath(n).name not in INTERNAL_MARKERS]
        report = reporter(progress)
        for index, name in enumerate(names, 1):
            target = target_path(dest, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            yield from self._download(_file_options(path, name), target)
            if report is not None:
                item = FileDownload(name, target, target.stat().st_size, index, len(names))
                yield Callback(report, item)
        dest.mkdir(parents=True, exist_ok=True)
        return dest

    if not TYPE_CHECKING:  # typed per twin below (the result depends on format and to)
        report = report_endpoint(
            "job_id",
            lambda job_id: _job_path(job_id, "report"),
            JobReport,
            """The job's report, built on request (current while it runs): training curves,
            the data-quality histogram, its evaluations and the manifest (spec, data sha256,
            code version, seed, wall-clock per phase). A JobReport (`format="json"`), the
            self-contained HTML page as a str (`format="html"`), or with `to=` written to
            that file and its Path returned.""",
        )


def _file_options(path: str, file: str) -> RequestOptions:
    return RequestOptions("GET", path, params={"file": file}, headers={"Accept": "*/*"})


class _CheckpointPage(BaseModel):
    data: list[Checkpoint] = []  # noqa: RUF012 - pydantic copies defaults


class Jobs(_Jobs, SyncAPIResource):
    """`client.jobs`."""

    _stream_class = JobEventStream

    if TYPE_CHECKING:
        report: SyncReport[JobReport]

    def stream_events(
        self, job_id: str, *, after: int = 0, max_reconnects: int = DEFAULT_MAX_RECONNECTS
    ) -> JobEventStream:
        """Follow the job's events live until it finishes (server-sent events, resumed with
        Last-Event-ID after a dropped connection). `stream.status` is the final status."""
        stream: JobEventStream = self._stream(job_id, after=after, max_reconnects=max_reconnects)
        return stream


class AsyncJobs(_Jobs, AsyncAPIResource):
    """`aclient.jobs`: the same methods, awaited; `on_event` may be a coroutine function."""

    _stream_class = AsyncJobEventStream

    def stream_events(
        self, job_id: str, *, after: int = 0, max_reconnects: int = DEFAULT_MAX_RECONNECTS
    ) -> AsyncJobEventStream:
        """See Jobs.stream_events: `async for event in stream`."""
        stream: AsyncJobEventStream = self._stream(
            job_id, after=after, max_reconnects=max_reconnects
        )
        return stream

    if TYPE_CHECKING:
        report: AsyncReport[JobReport]
