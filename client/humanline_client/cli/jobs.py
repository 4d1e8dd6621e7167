"""`humanline jobs`: create, estimate, list, show, cancel, events, wait (a job's outputs, metrics,
checkpoints, downloads and report, are in job_outputs)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .._client import Client
from .._progress import _fmt_eta
from ..types import Job, JobEstimate, JobEvent
from ._app import (
    FileOpt,
    JsonOpt,
    LimitOpt,
    SetOpt,
    SpecOpt,
    StatusOpt,
    TimeoutOpt,
    WaitOpt,
    jobs_app,
)
from ._output import (
    _apply_sets,
    _client,
    _command,
    _created,
    _emit,
    _finished,
    _first,
    _fmt,
    _load_spec,
    _out,
    _pairs,
    _require,
    _rows_table,
    _show_command,
    _table,
    _upload_local,
    _when,
)

JOB_COLUMNS = ["ID", "STATUS", "OBJECTIVE", "VARIANT", "MODEL", "STEP", "CREATED"]


def _step(job: Job) -> str:
    return f"{job.current_step}/{job.total_steps or '?'}"


def _job_rows(jobs: Iterable[Job]) -> list[list[Any]]:
    return [
        [j.id, j.status, j.objective, j.variant, j.base_model, _step(j), _when(j.created_at)]
        for j in jobs
    ]


def _show_job(job: Job) -> None:
    rows: list[list[Any]] = [
        ["id", job.id],
        ["status", job.status],
        ["objective", job.objective],
        ["variant", job.variant],
        ["base_model", job.base_model],
        ["training_file", job.training_file],
        ["step", _step(job)],
        ["attempt", job.attempt],
        ["created", _when(job.created_at)],
        ["started", _when(job.started_at)],
        ["finished", _when(job.finished_at)],
    ]
    if job.metadata:
        rows.append(["metadata", json.dumps(job.metadata)])
    if job.error:
        rows.append(["error", job.error.get("message", json.dumps(job.error))])
    if job.result:
        result = {k: v for k, v in job.result.items() if k != "final_model"}
        rows.append(["result", json.dumps(result, default=str)])
    if job.model_files:
        rows.append(["model", f"{len(job.model_files)} files: {', '.join(job.model_files)}"])
    _out().print(_table(["FIELD", "VALUE"], rows))
    hint = _model_hint(job)
    if hint:
        _out().print(hint, markup=False)


def _model_hint(job: Job) -> str:
    """How to get the trained model out, or why there is none (yet)."""
    if job.model_files:
        return (
            f"get the model with: humanline jobs download-model {job.id} -o {job.id}-model\n"
            f"  (python: client.jobs.download_model({job.id!r}, {job.id + '-model'!r}))"
        )
    if not job.is_terminal:
        return "the model is exported when the job succeeds: humanline jobs wait " + job.id
    if job.status == "succeeded":
        return "this job exported no model; its checkpoints: humanline jobs checkpoints " + job.id
    return ""


def _event_line(event: JobEvent) -> str:
    text = _progress_text(event.data or {}) if event.kind == "progress" else event.message
    return f"[{event.seq}] {_when(event.created_at)} {event.kind}: {text}"


def _progress_text(data: dict[str, Any]) -> str:
    """A `progress` event: "training step 12/100, loss 0.4312, ETA 1:23"."""
    step, total = data.get("step"), data.get("total_steps")
    parts = [str(data.get("phase") or "training").replace("_", " ")]
    if step is not None:
        parts[0] += f" step {step}" + (f"/{total}" if total else "")
    if isinstance(data.get("loss"), (int, float)):
        parts.append(f"loss {_fmt(float(data['loss']))}")
    if isinstance(data.get("eta_s"), (int, float)):
        parts.append(f"ETA {_fmt_eta(data['eta_s'])}")
    return ", ".join(parts)


def _wait_and_report(client: Client, job_id: str, as_json: bool, timeout: Optional[float]) -> None:
    # A bar on a terminal, plain log lines (step, loss, ETA) elsewhere; none with --json.
    job = client.jobs.wait(job_id, timeout=timeout, progress=not as_json)
    _finished(job, as_json, f"{job.id} {job.status}")


def _job_body(
    client: Client,
    spec: Optional[Path],
    model: Optional[str],
    file: Optional[str],
    objective: Optional[str],
    variant: Optional[str],
    max_steps: Optional[int],
    set_: Optional[list[str]],
    metadata: Optional[list[str]],
) -> dict[str, Any]:
    """The keywords of `jobs.create` and `jobs.estimate` alike, from a spec file and the
    options (an option wins; a local training file is uploaded first): the three required
    fields by name, every other field in `extra_body`."""
    body: dict[str, Any] = _load_spec(spec) if spec else {}
    if model:
        body["base_model"] = model
    if objective:
        current = body.get("objective")
        body["objective"] = (
            {**current, "name": objective} if isinstance(current, dict) else objective
        )
    if variant:
        body["variant"] = variant
    if max_steps is not None:
        body["max_steps"] = max_steps
    if metadata:
        body["metadata"] = {**body.get("metadata", {}), **_pairs(metadata, "--metadata")}
    body = _apply_sets(body, set_ or [])
    if file:
        body["training_file"] = file
    _upload_local(client, body, "training_file", "train")
    _require(body, {"base_model": "--model", "training_file": "--file", "objective": "--objective"})
    required = {name: body.pop(name) for name in ("base_model", "training_file", "objective")}
    return {**required, "extra_body": body}


ObjectiveOpt = Annotated[Optional[str], typer.Option(help="sft, dpo, kto or grpo.")]
VariantOpt = Annotated[
    Optional[str], typer.Option(help="offline, offline+humanline, online or online+humanline.")
]
MaxStepsOpt = Annotated[Optional[int], typer.Option(help="Stop after this many steps.")]


@_command(jobs_app, "create")
def jobs_create(
    model: Annotated[
        Optional[str], typer.Option("--model", help="Base model, e.g. smollm2-135m-instruct.")
    ] = None,
    file: FileOpt = None,
    objective: ObjectiveOpt = None,
    variant: VariantOpt = None,
    max_steps: MaxStepsOpt = None,
    set_: SetOpt = None,
    metadata: Annotated[
        Optional[list[str]], typer.Option("--metadata", help="key=value labels (repeatable).")
    ] = None,
    spec: SpecOpt = None,
    wait: WaitOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Submit a training job."""
    client = _client()
    request = _job_body(client, spec, model, file, objective, variant, max_steps, set_, metadata)
    job = client.jobs.create(**request)
    _created(
        job,
        as_json,
        (lambda: _wait_and_report(client, job.id, as_json, None)) if wait else None,
        f"created {job.id} ({job.objective}, {job.variant}, {job.base_model}): {job.status}\n"
        f"follow it with: humanline jobs events {job.id} --follow",
    )


def _duration(seconds: float) -> str:
    minutes, sec = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{sec:02d}" if hours else f"{minutes}:{sec:02d}"


def _show_estimate(est: JobEstimate) -> None:
    where = f"{est.gpus} x {est.device}" if est.gpus else f"{est.processes} x {est.device}"
    rows: list[list[Any]] = [
        ["runs on", f"{where} ({est.memory_available_gib:g} GiB per process)"],
        ["steps", est.steps],
        [
            "micro-batch",
            f"{est.micro_batch} examples x grad_accum {est.grad_accum}"
            + (", activation checkpointing" if est.activation_checkpointing else ""),
        ],
        [
            "memory per process",
            f"{est.memory_gib_per_process:.2f} GiB"
            + ("" if est.memory_fits else " (does not fit)"),
        ],
        ["training tokens", f"{est.tokens:,} ({est.tokens_per_step:,} a step)"],
        [
            "wall-clock",
            (
                f"{_duration(est.wall_clock_seconds)} (training "
                f"{_duration(est.train_seconds)}, start {_duration(est.startup_seconds)})"
            ),
        ],
        ["GPU-hours", f"{est.gpu_hours:.3f}"],
    ]
    if est.sampled_tokens:
        rows.append(
            [
                "sampling",
                (
                    f"{est.sampled_tokens:,} tokens, "
                    f"{_duration(est.sampling_seconds)} ({est.sampling_share:.0%} of the time)"
                ),
            ]
        )
    _out().print(_table(["FIELD", "VALUE"], rows))
    _out().print(f"tokens {est.tokens_method}", markup=False)
    for warning in est.warnings:
        _out().print(f"warning: {warning}", markup=False)


@_command(jobs_app, "estimate")
def jobs_estimate(
    spec_file: Annotated[
        Optional[Path],
        typer.Argument(
            help="Job spec (YAML or JSON), as for `jobs create --spec`.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="Base model.")] = None,
    file: FileOpt = None,
    objective: ObjectiveOpt = None,
    variant: VariantOpt = None,
    max_steps: MaxStepsOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What a job would cost (steps, tokens, memory, GPUs, wall-clock, GPU-hours), without
    creating it: the same spec and checks as `jobs create`."""
    client = _client()
    request = _job_body(client, spec_file, model, file, objective, variant, max_steps, set_, None)
    est = client.jobs.estimate(**request)
    _emit(est, as_json, _show_estimate)


@_command(jobs_app, "list")
def jobs_list(
    status: StatusOpt = None,
    metadata: Annotated[
        Optional[list[str]], typer.Option("--metadata", help="key=value filter (repeatable).")
    ] = None,
    limit: LimitOpt = 20,
    as_json: JsonOpt = False,
) -> None:
    """List jobs, newest first."""
    client, labels = _client(), _pairs(metadata or [], "--metadata")
    jobs = _first(lambda size: client.jobs.list(status=status, metadata=labels, limit=size), limit)
    _emit(jobs, as_json, _rows_table(JOB_COLUMNS, _job_rows))


_show_command(jobs_app, "job", lambda client, job_id: client.jobs.retrieve(job_id), _show_job)


@_command(jobs_app, "cancel")
def jobs_cancel(job_id: str, as_json: JsonOpt = False) -> None:
    """Cancel a job (a running one stops at its next step boundary)."""
    job = _client().jobs.cancel(job_id)
    _emit(job, as_json, lambda job: _out().print(f"{job.id} {job.status}"))


@_command(jobs_app, "events")
def jobs_events(
    job_id: str,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Stream until the job ends.")
    ] = False,
    after: Annotated[int, typer.Option(help="Only events after this seq.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Print a job's events (--json: one JSON object per line)."""
    client = _client()
    events: Iterable[JobEvent]
    if follow:
        events = client.jobs.stream_events(job_id, after=after)
    else:
        events = client.jobs.events(job_id, after=after, limit=1000)
    out = _out()
    for event in events:
        if as_json:
            typer.echo(json.dumps(event.to_dict(), default=str))
        else:
            out.print(_event_line(event), markup=False)
    if follow and not as_json:
        status = getattr(events, "status", None)
        out.print(f"job {job_id} ended: {status}")


@_command(jobs_app, "wait")
def jobs_wait(
    job_id: str,
    timeout: TimeoutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Wait for a job to finish; exit 1 unless it succeeded.

    Shows a progress bar on a terminal, and plain log lines (step, loss, ETA) elsewhere."""
    _wait_and_report(_client(), job_id, as_json, timeout)
