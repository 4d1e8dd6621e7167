"""`humanline`: the user-side command line of the Humanline service (files and jobs).

    humanline files upload prefs.jsonl
    humanline jobs create --objective dpo --variant offline+humanline \
        --model smollm2-135m-instruct --file file-... --set optim.lr=1e-6 --wait
    humanline jobs list --status running --json

Tables for people, `--json` for scripts. Configuration: --base-url/--api-key or
HUMANLINE_BASE_URL/HUMANLINE_API_KEY. Server-side commands (migrate, create-team, create-key,
serve) belong to `humanline-server`, which ships with the service, not with this SDK.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, TypeVar

try:
    import typer
    from rich.console import Console
    from rich.table import Table
except ImportError as exc:  # pragma: no cover - depends on the install
    raise SystemExit(
        f"the humanline CLI needs typer and rich ({exc}): pip install 'humanline-client[cli]'"
    ) from None

from ._client import Client
from ._exceptions import APIStatusError, HumanlineError
from ._version import __version__
from .types import BaseModel, Job, JobEvent

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    name="humanline",
    help=(
        "Humanline command line: upload training data and run DPO, KTO and GRPO jobs "
        "(offline or online, with or without humanline) on a Humanline server.\n\n"
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
app.add_typer(files_app, name="files")
app.add_typer(jobs_app, name="jobs")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts).")]


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


def main() -> None:
    """Console-script entry point (`humanline`)."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
