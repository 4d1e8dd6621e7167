"""`humanline`: the user-side command line of the Humanline service (files, jobs,
evaluations and reports).

    humanline files upload prefs.jsonl
    humanline jobs create --objective dpo --variant offline+humanline \
        --model smollm2-135m-instruct --file file-... --set optim.lr=1e-6 --wait
    humanline jobs list --status running --json
    humanline evals create --job job-... --file math.jsonl --kind math --wait
    humanline jobs report job-... --html report.html --open

Tables for people, `--json` for scripts. Configuration: --base-url/--api-key or
HUMANLINE_BASE_URL/HUMANLINE_API_KEY. Server-side commands (migrate, create-team, create-key,
serve) belong to `humanline-server`, which ships with the service, not with this SDK.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import webbrowser
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, TypeVar

try:
    import typer
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
except ImportError as exc:  # pragma: no cover - depends on the install
    raise SystemExit(
        f"the humanline CLI needs typer and rich ({exc}): pip install 'humanline-client[cli]'"
    ) from None

from ._client import Client
from ._exceptions import APIStatusError, HumanlineError
from ._version import __version__
from .types import BaseModel, Comparison, Evaluation, Job, JobEvent, JobReport

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    name="humanline",
    help=(
        "Humanline command line: upload training data, run DPO, KTO and GRPO jobs "
        "(offline or online, with or without humanline) on a Humanline server, evaluate "
        "them and fetch their reports.\n\n"
        "Configure with --base-url/--api-key or HUMANLINE_BASE_URL/HUMANLINE_API_KEY. "
        "Add --json to any command for machine-readable output.\n\n"
        "Server-side commands (migrate, create-team, create-key, serve) are in the "
        "service's own CLI, `humanline-server`."
    ),
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
files_app = typer.Typer(help="Upload, list, show, download and delete files.", no_args_is_help=True)
jobs_app = typer.Typer(
    help="Create, list, show, follow and cancel training jobs.", no_args_is_help=True
)
evals_app = typer.Typer(
    help="Create, list, show and wait for evaluations; fetch their reports.",
    no_args_is_help=True,
)
reports_app = typer.Typer(help="Reports across jobs.", no_args_is_help=True)
app.add_typer(files_app, name="files")
app.add_typer(jobs_app, name="jobs")
app.add_typer(evals_app, name="evals")
app.add_typer(reports_app, name="reports")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts).")]
HtmlOpt = Annotated[
    Optional[Path],
    typer.Option("--html", help="Save the HTML page to this file.", dir_okay=False),
]
OpenOpt = Annotated[
    bool,
    typer.Option(
        "--open", help="Open the HTML page in a browser (from a temporary file without --html)."
    ),
]


class _Config:
    def __init__(
        self, base_url: Optional[str], api_key: Optional[str], timeout: float, retries: int
    ):
        self.base_url = base_url
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = retries
        self._client: Optional[Client] = None

    def client(self) -> Client:
        if self._client is None:
            self._client = Client(
                base_url=self.base_url,
                api_key=self.api_key,
                timeout=self.timeout,
                max_retries=self.max_retries,
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def _version(value: bool) -> None:
    if value:
        typer.echo(f"humanline {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    base_url: Annotated[
        Optional[str],
        typer.Option(
            "--base-url",
            envvar="HUMANLINE_BASE_URL",
            help="Server root (default http://127.0.0.1:8000).",
        ),
    ] = None,
    api_key: Annotated[
        Optional[str],
        typer.Option(
            "--api-key", envvar="HUMANLINE_API_KEY", help="API key (hl_...).", show_default=False
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds per HTTP attempt.")] = 60.0,
    max_retries: Annotated[int, typer.Option(help="Retries of failed requests.")] = 2,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    config = _Config(base_url, api_key, timeout, max_retries)
    ctx.obj = config
    ctx.call_on_close(config.close)


# --- output -----------------------------------------------------------------------------


def _out() -> Console:
    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal:  # piped or captured: do not squeeze ids into 80 columns
        console.width = max(console.width, 160)
    return console


def _err() -> Console:
    return Console(stderr=True, highlight=False)


def _dump(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.to_dict()
    if isinstance(obj, list):
        return [_dump(x) for x in obj]
    return obj


def _print_json(obj: Any) -> None:
    typer.echo(json.dumps(_dump(obj), indent=2, default=str))


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


def _table(columns: list[str], rows: Iterable[list[Any]], *, id_width: int = 0) -> Table:
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for i, name in enumerate(columns):
        table.add_column(name, no_wrap=i == 0, min_width=id_width if i == 0 else None)
    for row in rows:
        table.add_row(*["-" if v is None else str(v) for v in row])
    return table


def _fail(exc: HumanlineError, as_json: bool) -> None:
    if as_json:
        body: dict[str, Any] = {
            "message": getattr(exc, "message", str(exc)),
            "type": type(exc).__name__,
        }
        for name in ("status_code", "field", "errors", "request_id"):
            value = getattr(exc, name, None)
            if value is not None:
                body[name] = value
        typer.echo(json.dumps({"error": body}, default=str), err=True)
    else:
        err = _err()
        err.print(f"[red]error:[/red] {exc}", markup=True)
        errors = getattr(exc, "errors", None) or []
        if isinstance(exc, APIStatusError) and (
            len(errors) > 1 or any("line" in e for e in errors)
        ):
            for item in errors[:20]:
                where = f"line {item['line']}" if item.get("line") else item.get("field") or ""
                err.print(f"  {where}: {item.get('message')}", markup=False)
    raise typer.Exit(1)


def _handles_errors(fn: F) -> F:
    """Turn SDK errors into one readable line (or a JSON object on stderr) and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except HumanlineError as exc:
            _fail(exc, bool(kwargs.get("as_json")))
        except (FileNotFoundError, ValueError) as exc:
            if kwargs.get("as_json"):
                typer.echo(
                    json.dumps({"error": {"message": str(exc), "type": type(exc).__name__}}),
                    err=True,
                )
            else:
                _err().print(f"[red]error:[/red] {exc}")
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _client(ctx: typer.Context) -> Client:
    return ctx.obj.client()


# --- files ------------------------------------------------------------------------------------


def _file_rows(files: Iterable[Any]) -> list[list[Any]]:
    return [
        [f.id, f.filename, f.purpose, f.format, f.records, f.bytes, _when(f.created_at)]
        for f in files
    ]


FILE_COLUMNS = ["ID", "FILENAME", "PURPOSE", "FORMAT", "RECORDS", "BYTES", "CREATED"]


def _show_file(f: Any) -> None:
    _out().print(_table(["FIELD", "VALUE"], [[k, v] for k, v in f.to_dict().items()]))


@files_app.command("upload")
@_handles_errors
def files_upload(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="A JSONL file.", exists=True, dir_okay=False)],
    purpose: Annotated[str, typer.Option(help="train or eval.")] = "train",
    as_json: JsonOpt = False,
) -> None:
    """Upload a JSONL file; the server validates every line (bad lines are listed)."""
    f = _client(ctx).files.upload(file=path, purpose=purpose)  # type: ignore[arg-type]
    if as_json:
        return _print_json(f)
    _out().print(f"{f.id}  {f.filename}: {f.records} {f.format} records, {f.bytes} bytes")


@files_app.command("list")
@_handles_errors
def files_list(
    ctx: typer.Context,
    purpose: Annotated[Optional[str], typer.Option(help="train or eval.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many files (newest first).")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """List files, newest first."""
    page_size = min(max(limit, 1), 100)
    files = list(_take(_client(ctx).files.list(purpose=purpose, limit=page_size), limit))  # type: ignore[arg-type]
    if as_json:
        return _print_json(files)
    _out().print(_table(FILE_COLUMNS, _file_rows(files), id_width=len(files[0].id) if files else 0))


@files_app.command("show")
@_handles_errors
def files_show(ctx: typer.Context, file_id: str, as_json: JsonOpt = False) -> None:
    """Show one file."""
    f = _client(ctx).files.retrieve(file_id)
    if as_json:
        return _print_json(f)
    _show_file(f)


@files_app.command("download")
@_handles_errors
def files_download(
    ctx: typer.Context,
    file_id: str,
    output: Annotated[
        Optional[Path], typer.Option("-o", "--output", help="Default: stdout.")
    ] = None,
) -> None:
    """Download a file's content."""
    client = _client(ctx)
    if output is None:
        sys.stdout.buffer.write(client.files.content(file_id))  # type: ignore[arg-type]
        sys.stdout.flush()
    else:
        client.files.content(file_id, to=output)
        _err().print(f"wrote {output}")


@files_app.command("delete")
@_handles_errors
def files_delete(ctx: typer.Context, file_id: str, as_json: JsonOpt = False) -> None:
    """Delete a file (refused while an active job trains on it)."""
    deleted = _client(ctx).files.delete(file_id)
    if as_json:
        return _print_json(deleted)
    _out().print(f"deleted {deleted.id}")


# --- jobs -------------------------------------------------------------------------------------


def _take(items: Iterable[Any], n: int) -> Iterable[Any]:
    for i, item in enumerate(items):
        if i >= n:
            return
        yield item


def _parse_value(text: str) -> Any:
    """JSON when it parses (numbers, true/false, null, lists, objects), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _apply_sets(spec: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """--set a.b=1 --set c=x → {"a": {"b": 1}, "c": "x"}, merged into `spec`."""
    for item in assignments:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected key=value, got {item!r}", param_hint="--set")
        node = spec
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if isinstance(child, str) and part == "objective":  # objective="dpo" → {"name": ...}
                child = {"name": child}
            if not isinstance(child, dict):
                child = {}
            node[part] = child
            node = child
        node[parts[-1]] = _parse_value(raw)
    return spec


def _pairs(items: list[str], option: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected key=value, got {item!r}", param_hint=option)
        out[key] = value
    return out


def _job_rows(jobs: Iterable[Job]) -> list[list[Any]]:
    return [
        [
            j.id,
            j.status,
            j.objective,
            j.variant,
            j.base_model,
            f"{j.current_step}/{j.total_steps or '?'}",
            _when(j.created_at),
        ]
        for j in jobs
    ]


JOB_COLUMNS = ["ID", "STATUS", "OBJECTIVE", "VARIANT", "MODEL", "STEP", "CREATED"]


def _show_job(job: Job) -> None:
    rows = [
        ["id", job.id],
        ["status", job.status],
        ["objective", job.objective],
        ["variant", job.variant],
        ["base_model", job.base_model],
        ["training_file", job.training_file],
        ["step", f"{job.current_step}/{job.total_steps or '?'}"],
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
        rows.append(["result", json.dumps(job.result, default=str)])
    _out().print(_table(["FIELD", "VALUE"], rows))


def _event_line(event: JobEvent) -> str:
    return f"[{event.seq}] {_when(event.created_at)} {event.kind}: {event.message}"


def _wait_and_report(client: Client, job_id: str, as_json: bool, timeout: Optional[float]) -> None:
    job = client.jobs.wait(
        job_id,
        timeout=timeout,
        progress=None if not as_json else False,
    )
    if as_json:
        _print_json(job)
    else:
        _out().print(f"{job.id} {job.status}")
        if job.error:
            _err().print(f"[red]{job.error.get('message', job.error)}[/red]")
    if job.status != "succeeded":
        raise typer.Exit(1)


@jobs_app.command("create")
@_handles_errors
def jobs_create(
    ctx: typer.Context,
    model: Annotated[
        Optional[str], typer.Option("--model", help="Base model, e.g. smollm2-135m-instruct.")
    ] = None,
    file: Annotated[
        Optional[str],
        typer.Option("--file", help="Training file id, or a local JSONL path (uploaded first)."),
    ] = None,
    objective: Annotated[Optional[str], typer.Option(help="dpo, kto or grpo.")] = None,
    variant: Annotated[
        Optional[str],
        typer.Option(help="offline, offline+humanline, online or online+humanline."),
    ] = None,
    max_steps: Annotated[Optional[int], typer.Option(help="Stop after this many steps.")] = None,
    set_: Annotated[
        Optional[list[str]],
        typer.Option(
            "--set",
            help="Any other spec field as key=value, dotted for nested fields; values are "
            "JSON when they parse: --set optim.lr=1e-6 --set humanline_params.sync_every=4",
        ),
    ] = None,
    metadata: Annotated[
        Optional[list[str]], typer.Option("--metadata", help="key=value labels (repeatable).")
    ] = None,
    spec: Annotated[
        Optional[Path],
        typer.Option(
            "--spec", help="A JSON job spec to start from (options override it).", exists=True
        ),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the job to finish.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Submit a training job."""
    client = _client(ctx)
    body: dict[str, Any] = json.loads(spec.read_text()) if spec else {}
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
    training_file = body.get("training_file")
    if isinstance(training_file, str) and Path(training_file).is_file():
        uploaded = client.files.upload(file=Path(training_file), purpose="train")
        _err().print(f"uploaded {training_file} as {uploaded.id}")
        body["training_file"] = uploaded.id
    missing = [name for name in ("base_model", "training_file", "objective") if not body.get(name)]
    if missing:
        flags = {"base_model": "--model", "training_file": "--file", "objective": "--objective"}
        raise typer.BadParameter("missing " + ", ".join(flags[m] for m in missing))
    base_model = body.pop("base_model")
    training_file = body.pop("training_file")
    objective_value = body.pop("objective")
    job = client.jobs.create(
        base_model=base_model,
        training_file=training_file,
        objective=objective_value,
        extra_body=body,
    )
    if wait:
        if not as_json:
            _out().print(f"created {job.id}; waiting for it to finish")
        return _wait_and_report(client, job.id, as_json, None)
    if as_json:
        return _print_json(job)
    _out().print(
        f"created {job.id} ({job.objective}, {job.variant}, {job.base_model}): {job.status}\n"
        f"follow it with: humanline jobs events {job.id} --follow"
    )


@jobs_app.command("list")
@_handles_errors
def jobs_list(
    ctx: typer.Context,
    status: Annotated[Optional[str], typer.Option(help="Only jobs in this status.")] = None,
    metadata: Annotated[
        Optional[list[str]], typer.Option("--metadata", help="key=value filter (repeatable).")
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many jobs (newest first).")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """List jobs, newest first."""
    page_size = min(max(limit, 1), 100)
    listing = _client(ctx).jobs.list(
        status=status, metadata=_pairs(metadata or [], "--metadata"), limit=page_size
    )
    jobs = list(_take(listing, limit))
    if as_json:
        return _print_json(jobs)
    _out().print(_table(JOB_COLUMNS, _job_rows(jobs), id_width=len(jobs[0].id) if jobs else 0))


@jobs_app.command("show")
@_handles_errors
def jobs_show(ctx: typer.Context, job_id: str, as_json: JsonOpt = False) -> None:
    """Show one job."""
    job = _client(ctx).jobs.retrieve(job_id)
    if as_json:
        return _print_json(job)
    _show_job(job)


@jobs_app.command("cancel")
@_handles_errors
def jobs_cancel(ctx: typer.Context, job_id: str, as_json: JsonOpt = False) -> None:
    """Cancel a job (a running one stops at its next step boundary)."""
    job = _client(ctx).jobs.cancel(job_id)
    if as_json:
        return _print_json(job)
    _out().print(f"{job.id} {job.status}")


@jobs_app.command("events")
@_handles_errors
def jobs_events(
    ctx: typer.Context,
    job_id: str,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Stream until the job ends.")
    ] = False,
    after: Annotated[int, typer.Option(help="Only events after this seq.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Print a job's events (--json: one JSON object per line)."""
    client = _client(ctx)
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


@jobs_app.command("wait")
@_handles_errors
def jobs_wait(
    ctx: typer.Context,
    job_id: str,
    timeout: Annotated[
        Optional[float], typer.Option(help="Give up after this many seconds.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Wait for a job to finish (progress bar on a terminal); exit 1 unless it succeeded."""
    _wait_and_report(_client(ctx), job_id, as_json, timeout)


@jobs_app.command("metrics")
@_handles_errors
def jobs_metrics(
    ctx: typer.Context,
    job_id: str,
    last: Annotated[Optional[int], typer.Option(help="Only the last N steps.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Per-step training metrics."""
    metrics = list(_client(ctx).jobs.metrics(job_id))
    if last is not None:
        metrics = metrics[-last:] if last > 0 else []
    if as_json:
        return _print_json(metrics)
    names: list[str] = []
    for m in metrics:
        names += [k for k in m.values if k not in names]
    rows = [[m.step, *[_fmt(m.values.get(n)) for n in names]] for m in metrics]
    _out().print(_table(["STEP", *[n.upper() for n in names]], rows))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


@jobs_app.command("checkpoints")
@_handles_errors
def jobs_checkpoints(ctx: typer.Context, job_id: str, as_json: JsonOpt = False) -> None:
    """List a job's checkpoints."""
    checkpoints = list(_client(ctx).jobs.checkpoints(job_id))
    if as_json:
        return _print_json(checkpoints)
    rows = [[c.step, c.bytes, ", ".join(c.files or []), _when(c.created_at)] for c in checkpoints]
    _out().print(_table(["STEP", "BYTES", "FILES", "CREATED"], rows))


@jobs_app.command("download")
@_handles_errors
def jobs_download(
    ctx: typer.Context,
    job_id: str,
    step: Annotated[int, typer.Option(help="Checkpoint step.")],
    file: Annotated[str, typer.Option("--file", help="A file name of that checkpoint.")],
    output: Annotated[
        Optional[Path], typer.Option("-o", "--output", help="Default: the file's name.")
    ] = None,
) -> None:
    """Download one file of a checkpoint."""
    dest = output or Path(Path(file).name)
    _client(ctx).jobs.download_checkpoint(job_id, step=step, file=file, to=dest)
    _err().print(f"wrote {dest}")


@jobs_app.command("report")
@_handles_errors
def jobs_report(
    ctx: typer.Context,
    job_id: str,
    html: HtmlOpt = None,
    open_: OpenOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """A job's report: training curves, data quality, evaluations, manifest.

    --json prints all of it; --html FILE saves the HTML page, --open shows it in a browser."""
    client = _client(ctx)
    if html is not None or open_:
        _save_html(lambda to: client.jobs.report(job_id, format="html", to=to), html, open_, job_id)
        if not as_json:
            return None
    report = client.jobs.report(job_id)
    if as_json:
        return _print_json(report)
    _show_job_report(report)


# --- reports ----------------------------------------------------------------------------------


def _save_html(fetch: Callable[[Path], Any], path: Optional[Path], open_: bool, name: str) -> Path:
    """Download a report page to `path` (a temporary file when only --open asks for it) and
    open it in a browser when asked."""
    if path is None:
        fd, tmp = tempfile.mkstemp(prefix=f"{name}-", suffix=".html")
        os.close(fd)
        path = Path(tmp)
    dest = Path(fetch(path))
    _err().print(f"wrote {dest}", markup=False)
    if open_ and not webbrowser.open(dest.resolve().as_uri()):
        _err().print(f"could not open a browser; the page is {dest}", markup=False)
    return dest


def _metric(value: Any) -> str:
    """A metric as stored: {"value", "se", "n"} → "0.41 ± 0.017 (n=100)", numbers as they are."""
    if isinstance(value, dict) and "value" in value:
        text = _fmt(value.get("value"))
        if isinstance(value.get("se"), (int, float)):
            text += f" ± {_fmt(value['se'])}"
        if value.get("n"):
            text += f" (n={value['n']})"
        return text
    return _fmt(value)


HEADLINE = {"instruction": "lc_win_rate", "math": "pass_at_1"}


def _headline(kind: Any, metrics: Any) -> str:
    name = HEADLINE.get(str(kind), "")
    value = (metrics or {}).get(name) if isinstance(metrics, dict) else None
    return f"{name} {_metric(value)}" if value is not None else "-"


def _target(ev: Any) -> str:
    """What an evaluation evaluates: `job-... (final)`, `job-... step 5`, `base MODEL`."""
    job_id, step, base = (
        (ev.get("job_id"), ev.get("step"), ev.get("base_model"))
        if isinstance(ev, dict)
        else (ev.job_id, ev.step, ev.base_model)
    )
    if job_id is None:
        return f"base {base}"
    return f"{job_id} (final)" if step is None else f"{job_id} step {step}"


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


def _show_comparison(doc: Comparison) -> None:
    out = _out()
    rows = [
        [
            r.job_id,
            r.objective,
            r.variant,
            _metric({"value": r.value, "se": r.se, "n": r.n}) if r.value is not None else "-",
            r.evaluation_id,
            ("final" if r.step is None else r.step) if r.evaluation_id else None,
        ]
        for r in doc.rows
    ]
    out.print(
        _table(["JOB", "OBJECTIVE", "VARIANT", doc.metric.upper(), "EVALUATION", "MODEL"], rows)
    )
    for t in doc.tests:
        out.print(
            f"{t.objective}: {t.a} - {t.b} = {_fmt(t.difference)} "
            f"(p = {_fmt(t.p_value)}, Holm {_fmt(t.p_holm)})",
            markup=False,
        )
    for warning in doc.warnings:
        _err().print(f"[yellow]warning:[/yellow] {escape(str(warning))}")


@reports_app.command("compare")
@_handles_errors
def reports_compare(
    ctx: typer.Context,
    jobs: Annotated[list[str], typer.Argument(help="Job ids (or one comma-separated list).")],
    metric: Annotated[
        Optional[str],
        typer.Option(help="lc_win_rate (default), win_rate, pass_at_1, pass_at_n, ..."),
    ] = None,
    file_id: Annotated[
        Optional[str], typer.Option("--file-id", help="Only evaluations on this eval file.")
    ] = None,
    html: HtmlOpt = None,
    open_: OpenOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Compare jobs on an evaluation metric (the paper's Figure 1).

    One row per job (its newest succeeded evaluation reporting the metric), and z-tests of
    offline+humanline vs offline and online vs offline+humanline per objective. --html FILE
    saves the page with the bar chart, --open shows it in a browser."""
    client = _client(ctx)
    ids = [j for item in jobs for j in item.split(",") if j.strip()]
    if html is not None or open_:
        _save_html(
            lambda to: client.reports.compare(
                jobs=ids, format="html", metric=metric, file_id=file_id, to=to
            ),
            html,
            open_,
            "comparison",
        )
        if not as_json:
            return None
    doc = client.reports.compare(jobs=ids, metric=metric, file_id=file_id)
    if as_json:
        return _print_json(doc)
    _show_comparison(doc)


# --- evaluations ------------------------------------------------------------------------------


def _eval_rows(evals: Iterable[Evaluation]) -> list[list[Any]]:
    return [
        [
            e.id,
            e.status,
            e.kind,
            _target(e),
            _headline(e.kind, e.metrics),
            _when(e.created_at),
        ]
        for e in evals
    ]


EVAL_COLUMNS = ["ID", "STATUS", "KIND", "MODEL", "RESULT", "CREATED"]


def _show_eval(ev: Evaluation) -> None:
    config = ev.config or {}
    judge = config.get("judge") or {}
    rows: list[list[Any]] = [
        ["id", ev.id],
        ["status", ev.status],
        ["kind", ev.kind],
        ["model", _target(ev)],
        ["file", ev.file_id],
    ]
    if judge:
        rows.append(
            [
                "judge",
                " ".join(str(judge[k]) for k in ("type", "base_url", "model") if judge.get(k)),
            ]
        )
    if config.get("generation"):
        rows.append(["generation", json.dumps(config["generation"])])
    progress = (ev.result or {}).get("progress")
    if progress and not ev.is_terminal:
        rows.append(
            ["progress", f"{progress.get('phase')} {progress.get('done')}/{progress.get('total')}"]
        )
    for name, value in ev.metrics.items():
        rows.append([name, _metric(value)])
    rows += [["created", _when(ev.created_at)], ["finished", _when(ev.finished_at)]]
    if ev.error:
        rows.append(["error", ev.error.get("message", json.dumps(ev.error))])
    _out().print(_table(["FIELD", "VALUE"], rows))


def _wait_for_eval(
    client: Client, eval_id: str, as_json: bool, timeout: Optional[float], poll_interval: float
) -> None:
    def note(ev: Evaluation) -> None:
        progress = (ev.result or {}).get("progress") or {}
        where = (
            f" ({progress.get('phase')} {progress.get('done')}/{progress.get('total')})"
            if progress and not ev.is_terminal
            else ""
        )
        _err().print(f"{ev.id} {ev.status}{where}", markup=False)

    ev = client.evaluations.wait(
        eval_id,
        timeout=timeout,
        poll_interval=poll_interval,
        on_update=None if as_json else note,
    )
    if as_json:
        _print_json(ev)
    else:
        _out().print(f"{ev.id} {ev.status}: {_headline(ev.kind, ev.metrics)}", markup=False)
        if ev.error:
            _err().print(f"[red]{escape(str(ev.error.get('message', ev.error)))}[/red]")
    if ev.status != "succeeded":
        raise typer.Exit(1)


@evals_app.command("create")
@_handles_errors
def evals_create(
    ctx: typer.Context,
    file: Annotated[
        Optional[str],
        typer.Option("--file", help="Eval file id, or a local JSONL path (uploaded first)."),
    ] = None,
    kind: Annotated[Optional[str], typer.Option(help="instruction or math.")] = None,
    job: Annotated[
        Optional[str], typer.Option("--job", help="Evaluate this job (its final model).")
    ] = None,
    step: Annotated[Optional[int], typer.Option(help="...or its checkpoint at this step.")] = None,
    model: Annotated[
        Optional[str], typer.Option("--model", help="...or this base model instead of a job.")
    ] = None,
    judge_url: Annotated[
        Optional[str],
        typer.Option(help="Instruction: an OpenAI-compatible judge endpoint the server allows."),
    ] = None,
    judge_model: Annotated[
        Optional[str], typer.Option(help="Instruction: the judge's model at --judge-url.")
    ] = None,
    reward_model: Annotated[
        Optional[str],
        typer.Option(help="Instruction: judge with this configured reward model instead."),
    ] = None,
    max_items: Annotated[
        Optional[int], typer.Option(help="Evaluate only the first N items.")
    ] = None,
    set_: Annotated[
        Optional[list[str]],
        typer.Option(
            "--set",
            help="Any other field as key=value, dotted for nested fields; values are JSON "
            "when they parse: --set generation.n=8 --set prompt_template='Q: {problem}'",
        ),
    ] = None,
    spec: Annotated[
        Optional[Path],
        typer.Option(
            "--spec", help="A JSON request to start from (options override it).", exists=True
        ),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for it to finish.")] = False,
    poll_interval: Annotated[float, typer.Option(help="With --wait: seconds between polls.")] = 2.0,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate a job or a base model on an eval file.

    --job evaluates the job's final model, --job with --step one of its checkpoints, --model
    a base model. Instruction evaluations need a judge (--judge-url and --judge-model, or
    --reward-model); --file may be a local JSONL path (uploaded with purpose eval)."""
    client = _client(ctx)
    body: dict[str, Any] = json.loads(spec.read_text()) if spec else {}
    for key, value in (
        ("kind", kind),
        ("job_id", job),
        ("step", step),
        ("base_model", model),
        ("max_items", max_items),
        ("file_id", file),
    ):
        if value is not None:
            body[key] = value
    if reward_model:
        body["judge"] = {"type": "reward_model", "model": reward_model}
    elif judge_url or judge_model:
        body["judge"] = {"type": "openai", "base_url": judge_url, "model": judge_model}
    body = _apply_sets(body, set_ or [])
    file_id = body.get("file_id")
    if isinstance(file_id, str) and Path(file_id).is_file():
        uploaded = client.files.upload(file=Path(file_id), purpose="eval")
        _err().print(f"uploaded {file_id} as {uploaded.id}")
        body["file_id"] = uploaded.id
    missing = [name for name in ("file_id", "kind") if not body.get(name)]
    if missing:
        flags = {"file_id": "--file", "kind": "--kind"}
        raise typer.BadParameter("missing " + ", ".join(flags[m] for m in missing))
    ev = client.evaluations.create(
        file_id=body.pop("file_id"), kind=body.pop("kind"), extra_body=body
    )
    if wait:
        if not as_json:
            _out().print(f"created {ev.id}; waiting for it to finish")
        return _wait_for_eval(client, ev.id, as_json, None, poll_interval)
    if as_json:
        return _print_json(ev)
    _out().print(
        f"created {ev.id} ({ev.kind}, {_target(ev)}): {ev.status}\n"
        f"follow it with: humanline evals wait {ev.id}",
        markup=False,
    )


@evals_app.command("list")
@_handles_errors
def evals_list(
    ctx: typer.Context,
    job: Annotated[Optional[str], typer.Option("--job", help="Only this job's.")] = None,
    status: Annotated[Optional[str], typer.Option(help="Only in this status.")] = None,
    kind: Annotated[Optional[str], typer.Option(help="instruction or math.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many (newest first).")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """List evaluations, newest first."""
    page_size = min(max(limit, 1), 100)
    listing = _client(ctx).evaluations.list(job_id=job, status=status, kind=kind, limit=page_size)
    evals = list(_take(listing, limit))
    if as_json:
        return _print_json(evals)
    _out().print(_table(EVAL_COLUMNS, _eval_rows(evals), id_width=len(evals[0].id) if evals else 0))


@evals_app.command("show")
@_handles_errors
def evals_show(ctx: typer.Context, eval_id: str, as_json: JsonOpt = False) -> None:
    """Show one evaluation (its metrics once it succeeded)."""
    ev = _client(ctx).evaluations.retrieve(eval_id)
    if as_json:
        return _print_json(ev)
    _show_eval(ev)


@evals_app.command("wait")
@_handles_errors
def evals_wait(
    ctx: typer.Context,
    eval_id: str,
    timeout: Annotated[
        Optional[float], typer.Option(help="Give up after this many seconds.")
    ] = None,
    poll_interval: Annotated[float, typer.Option(help="Seconds between polls.")] = 2.0,
    as_json: JsonOpt = False,
) -> None:
    """Wait for an evaluation to finish; exit 1 unless it succeeded."""
    _wait_for_eval(_client(ctx), eval_id, as_json, timeout, poll_interval)


@evals_app.command("report")
@_handles_errors
def evals_report(
    ctx: typer.Context,
    eval_id: str,
    html: HtmlOpt = None,
    open_: OpenOpt = False,
    output: Annotated[
        Optional[Path],
        typer.Option("-o", "--output", help="Save the JSON report (every item) to this file."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """A succeeded evaluation's report: metrics and every item's answers and verdicts.

    --json prints all of it, -o FILE saves it; --html FILE saves the HTML page, --open shows
    it in a browser."""
    client = _client(ctx)
    if html is not None or open_:
        _save_html(
            lambda to: client.evaluations.report(eval_id, format="html", to=to),
            html,
            open_,
            eval_id,
        )
    if output is not None:
        client.evaluations.report(eval_id, to=output)
        _err().print(f"wrote {output}", markup=False)
    if (html is not None or open_ or output is not None) and not as_json:
        return None
    report = client.evaluations.report(eval_id)
    if as_json:
        return _print_json(report)
    out = _out()
    rows = [[name, _metric(value)] for name, value in report.metrics.items()]
    out.print(_table(["METRIC", "VALUE"], rows))
    out.print(f"{len(report.items)} items (--json or -o FILE for each one)", markup=False)


def main() -> None:
    """Console-script entry point (`humanline`)."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
