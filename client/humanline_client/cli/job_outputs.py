"""`humanline jobs` commands about a job's outputs: metrics, checkpoints, download,
download-model, report."""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from ..resources.jobs import INTERNAL_MARKERS, FileDownload
from ..types import JobReport
from . import jobs  # noqa: F401 - its commands come first in `humanline jobs --help`
from ._app import HtmlOpt, JsonOpt, OpenOpt, jobs_app
from ._output import (
    _client,
    _command,
    _err,
    _fmt,
    _headline,
    _out,
    _print_json,
    _report,
    _table,
    _target,
    _when,
)


@_command(jobs_app, "metrics")
def jobs_metrics(
    job_id: str,
    last: Annotated[Optional[int], typer.Option(help="Only the last N steps.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Per-step training metrics.

    TIME is the wall-clock time (UTC) the step was logged; *_TIME columns are seconds. A
    table too wide for the screen is split, STEP repeated."""
    metrics = list(_client().jobs.metrics(job_id))
    if last is not None:
        metrics = metrics[-last:] if last > 0 else []
    if as_json:
        return _print_json(metrics)
    names: list[str] = []
    for m in metrics:
        names += [k for k in m.values if k not in names]
    rows = [[str(m.step), *[_metric_cell(n, m.values.get(n)) for n in names]] for m in metrics]
    out = _out()
    for columns in _column_groups(["STEP", *[n.upper() for n in names]], rows, out.width):
        out.print(_table([name for _, name in columns], [[r[i] for i, _ in columns] for r in rows]))


def _metric_cell(name: str, value: Any) -> str:
    """`time` (a Unix timestamp) as a clock time, `*_time` (durations) in seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if name == "time":
            return datetime.fromtimestamp(value, tz=timezone.utc).strftime("%H:%M:%S")
        if name.endswith("_time"):
            return f"{value:.3g}s"
    return _fmt(value)


def _column_groups(
    columns: list[str], rows: list[list[str]], width: int
) -> list[list[tuple[int, str]]]:
    """Columns in groups that fit `width` whole (headers are never cut), each group led by
    the first column."""
    widths = [max([len(c), *(len(r[i]) for r in rows)]) + 2 for i, c in enumerate(columns)]
    groups: list[list[tuple[int, str]]] = []
    group: list[tuple[int, str]] = [(0, columns[0])]
    used = widths[0]
    for i in range(1, len(columns)):
        if len(group) > 1 and used + widths[i] > width:
            groups.append(group)
            group, used = [(0, columns[0])], widths[0]
        group.append((i, columns[i]))
        used += widths[i]
    return [*groups, group]


@_command(jobs_app, "checkpoints")
def jobs_checkpoints(job_id: str, as_json: JsonOpt = False) -> None:
    """List a job's checkpoints."""
    checkpoints = list(_client().jobs.checkpoints(job_id))
    if as_json:
        return _print_json(checkpoints)
    rows = [
        [c.step, c.bytes, ", ".join(_data_files(c.files)), _when(c.created_at)] for c in checkpoints
    ]
    _out().print(_table(["STEP", "BYTES", "FILES", "CREATED"], rows))


def _data_files(names: Optional[list[str]]) -> list[str]:
    return [n for n in names or [] if Path(n).name not in INTERNAL_MARKERS]


@_command(jobs_app, "download")
def jobs_download(
    job_id: str,
    step: Annotated[int, typer.Option(help="Checkpoint step.")],
    file: Annotated[
        Optional[str],
        typer.Option("--file", help="One file of that checkpoint (default: all of them)."),
    ] = None,
    output: Annotated[
        Optional[Path],
        typer.Option(
            "-o",
            "--output",
            help="Where to write: the file (default its name), or with no --file the "
            "directory (default JOB-step-N).",
        ),
    ] = None,
) -> None:
    """Download a checkpoint (training state), or one file of it.

    A checkpoint is resume material (weights, optimizer, RNG); the trained model to load
    elsewhere is `humanline jobs download-model`."""
    client = _client()
    if file is not None:
        dest = output or Path(Path(file).name)
        client.jobs.download_checkpoint(job_id, step=step, file=file, to=dest)
    else:
        dest = output or Path(f"{job_id}-step-{step}")
        client.jobs.download_checkpoint(job_id, step=step, to=dest, progress=_file_progress)
    _err().print(f"wrote {dest}", markup=False)


@_command(jobs_app, "download-model")
def jobs_download_model(
    job_id: str,
    output: Annotated[
        Optional[Path],
        typer.Option("-o", "--output", help="The directory (default JOB-model).", file_okay=False),
    ] = None,
) -> None:
    """Download the trained model of a succeeded job (the whole directory).

    An adapter or a full model directory that transformers/peft load; one line per file
    as it arrives."""
    dest = output or Path(f"{job_id}-model")
    _client().jobs.download_model(job_id, dest, progress=_file_progress)
    _err().print(f"wrote {dest}", markup=False)


def _file_progress(item: FileDownload) -> None:
    _err().print(item.line(), markup=False)


@_command(jobs_app, "report")
def jobs_report(
    job_id: str,
    html: HtmlOpt = None,
    open_: OpenOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """A job's report: training curves, data quality, evaluations, manifest.

    --json prints all of it; --html FILE saves the HTML page, --open shows it in a browser."""
    fetch = functools.partial(_client().jobs.report, job_id)
    _report(fetch, job_id, html, open_, as_json, _show_job_report)


def _show_job_report(report: JobReport) -> None:
    job = report.job
    out = _out()
    out.print(
        f"{job.get('id')}  {job.get('status')}  {job.get('objective')} {job.get('variant')} "
        f"{job.get('base_model')}",
        markup=False,
    )
    training = report.training
    out.print(
        f"steps logged: {training.get('steps_logged', 0)} (last {_fmt(training.get('last_step'))})",
        markup=False,
    )
    final = training.get("final") or {}
    if final:
        out.print(
            _table(["METRIC", "LAST VALUE"], [[k, _fmt(v)] for k, v in sorted(final.items())])
        )
    manifest = report.manifest
    tf = manifest.get("training_file") or {}
    out.print(
        f"seed {_fmt(manifest.get('seed'))}, code {_fmt(manifest.get('code_version'))}, "
        f"training data sha256 {_fmt(tf.get('sha256'))}",
        markup=False,
    )
    dq = report.data_quality or {}
    if dq.get("n"):
        out.print(
            f"data quality: mean token log-prob {_fmt(dq.get('mean'))} over {dq['n']} examples",
            markup=False,
        )
    if report.evaluations:
        rows = [
            [
                e.get("id"),
                e.get("kind"),
                e.get("status"),
                _target(e),
                _headline(e.get("kind"), e.get("metrics")),
            ]
            for e in report.evaluations
        ]
        out.print(_table(["EVALUATION", "KIND", "STATUS", "MODEL", "RESULT"], rows))
    else:
        out.print("no evaluations yet (humanline evals create --job ...)", markup=False)
    for warning in report.warnings:
        _err().print(f"[yellow]warning:[/yellow] {escape(str(warning))}")
