"""What every command module shares: output (tables for people, JSON for scripts), error
reporting, `--set`/`--spec` parsing, and the formatting of values, metrics and models."""

from __future__ import annotations

import functools
import json
import os
import tempfile
import webbrowser
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .._client import Client
from .._exceptions import APIStatusError, HumanlineError
from ..types import BaseModel
from ._app import configured_client

F = TypeVar("F", bound=Callable[..., Any])

# --- output -----------------------------------------------------------------------------


def _out() -> Console:
    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal:  # piped or captured: do not squeeze ids into 80 columns
        console.width = max(console.width, 160)
    return console


def _err() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)  # paths stay whole


def _dump(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.to_dict()
    if isinstance(obj, list):
        return [_dump(x) for x in obj]
    return obj


def _print_json(obj: Any) -> None:
    typer.echo(json.dumps(_dump(obj), indent=2, default=str))


def _emit(value: Any, as_json: bool, show: Callable[[Any], Any]) -> None:
    """`--json`: the value as JSON; otherwise `show(value)` renders it for people."""
    if as_json:
        _print_json(value)
    else:
        show(value)


def _rows_table(
    columns: list[str], rows: Callable[[Any], list[list[Any]]]
) -> Callable[[Any], None]:
    """How a listing is shown: a table of `columns`, the id column as wide as the ids."""

    def show(items: list[Any]) -> None:
        _out().print(_table(columns, rows(items), id_width=len(items[0].id) if items else 0))

    return show


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
            for item in errors[:20]:  # every error of every line, each with its field
                parts = [
                    f"line {item['line']}" if item.get("line") else "",
                    item.get("field") or "",
                ]
                where = ": ".join(p for p in parts if p)
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


def _command(app: typer.Typer, name: str) -> Callable[[F], F]:
    """`@_command(jobs_app, "list")`: the command `name` of `app`, its SDK errors reported as
    one readable line (or a JSON object on stderr) and exit status 1 (_handles_errors)."""

    def register(fn: F) -> F:
        handled = _handles_errors(fn)
        app.command(name)(handled)
        return handled

    return register


def _client() -> Client:
    """The client the global options configured."""
    return configured_client()


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


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


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


def _first(listing: Callable[[int], Iterable[Any]], limit: int) -> list[Any]:
    """At most `limit` items of a listing, asked for in pages of up to 100."""
    return list(_take(listing(min(max(limit, 1), 100)), limit))


# --- what commands of the same form share ---------------------------------------------------


def _show_command(
    app: typer.Typer,
    noun: str,
    retrieve: Callable[[Client, str], Any],
    render: Callable[[Any], Any],
) -> None:
    """`humanline <resource> show <NOUN>_ID [--json]`: one object, for people or as JSON."""

    @app.command("show", help=f"Show one {noun}.")
    @_handles_errors
    def show(
        object_id: str = typer.Argument(..., metavar=f"{noun.upper()}_ID"),
        as_json: bool = typer.Option(False, "--json", help="Print JSON (for scripts)."),
    ) -> None:
        _emit(retrieve(_client(), object_id), as_json, render)


def _report(
    fetch: Callable[..., Any],
    name: str,
    html: Optional[Path],
    open_: bool,
    as_json: bool,
    show: Callable[[Any], Any],
    *,
    saved: bool = False,
) -> None:
    """A report command: --html FILE saves the page, --open shows it; then, unless only files
    were asked for (`saved`: the command wrote another), the report as JSON or for people.
    `fetch(**kw)` is the SDK's report call with its object named."""
    if html is not None or open_:
        _save_html(lambda to: fetch(format="html", to=to), html, open_, name)
        saved = True
    if not saved or as_json:
        _emit(fetch(), as_json, show)


def _upload_local(client: Client, body: dict[str, Any], key: str, purpose: str) -> None:
    """`body[key]` naming a local file (rather than a file id): upload it, name its id."""
    value = body.get(key)
    if isinstance(value, str) and Path(value).is_file():
        uploaded = client.files.upload(file=Path(value), purpose=purpose)  # type: ignore[arg-type]
        _err().print(f"uploaded {value} as {uploaded.id}")
        body[key] = uploaded.id


def _require(body: dict[str, Any], flags: dict[str, str]) -> None:
    """Every field in `flags` (field -> its option) set, or a usage error naming the options."""
    missing = [flag for name, flag in flags.items() if not body.get(name)]
    if missing:
        raise typer.BadParameter("missing " + ", ".join(missing))


def _created(obj: Any, as_json: bool, wait: Optional[Callable[[], None]], summary: str) -> None:
    """What a create command prints: with --wait, a note (not with --json) then `wait()`;
    otherwise the object as JSON, or `summary`."""
    if wait is not None:
        if not as_json:
            _out().print(f"created {obj.id}; waiting for it to finish")
        return wait()
    if as_json:
        return _print_json(obj)
    _out().print(summary, markup=False)
    return None


def _finished(obj: Any, as_json: bool, summary: str) -> None:
    """What a wait ends with: the job or evaluation as JSON, or `summary` and its error for
    people; exit 1 unless it succeeded."""
    if as_json:
        _print_json(obj)
    else:
        _out().print(summary, markup=False)
        if obj.error:
            _err().print(f"[red]{escape(str(obj.error.get('message', obj.error)))}[/red]")
    if obj.status != "succeeded":
        raise typer.Exit(1)


def _load_spec(path: Path) -> dict[str, Any]:
    """A `--spec` file: YAML (.yaml, .yml) or JSON (.json); another suffix is tried as JSON,
    then as YAML. Errors name the file, the format and the place."""
    text = path.read_text(encoding="utf-8-sig")
    suffix = path.suffix.lower()
    formats = (
        ["yaml"]
        if suffix in (".yaml", ".yml")
        else ["json"]
        if suffix == ".json"
        else ["json", "yaml"]
    )
    problems = []
    for fmt in formats:
        try:
            value = json.loads(text) if fmt == "json" else _yaml_load(text)
        except ValueError as exc:
            problems.append(f"not valid {fmt.upper()} ({exc})")
            continue
        if not isinstance(value, dict):
            raise ValueError(  # noqa: TRY004 - a bad file, reported as one line
                f"--spec {path}: expected a {fmt.upper()} mapping of spec fields, "
                f"got {type(value).__name__}"
            )
        return value
    raise ValueError(f"--spec {path}: " + "; ".join(problems))


def _yaml_load(text: str) -> Any:
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - depends on the install
        raise ValueError("reading YAML needs PyYAML: pip install 'humanline-client[cli]'") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(" ".join(str(exc).split())) from None
