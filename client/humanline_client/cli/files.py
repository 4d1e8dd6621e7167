"""`humanline files`: upload, list, show, download, delete."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ._app import JsonOpt, LimitOpt, files_app
from ._output import (
    _client,
    _command,
    _emit,
    _err,
    _first,
    _out,
    _rows_table,
    _show_command,
    _table,
    _when,
)

FILE_COLUMNS = ["ID", "FILENAME", "PURPOSE", "FORMAT", "RECORDS", "BYTES", "CREATED"]


def _file_rows(files: Iterable[Any]) -> list[list[Any]]:
    return [
        [f.id, f.filename, f.purpose, f.format, f.records, f.bytes, _when(f.created_at)]
        for f in files
    ]


def _show_file(f: Any) -> None:
    _out().print(_table(["FIELD", "VALUE"], [[k, v] for k, v in f.to_dict().items()]))


@_command(files_app, "upload")
def files_upload(
    path: Annotated[Path, typer.Argument(help="A JSONL file.", exists=True, dir_okay=False)],
    purpose: Annotated[str, typer.Option(help="train or eval.")] = "train",
    as_json: JsonOpt = False,
) -> None:
    """Upload a JSONL file; the server validates every line (bad lines are listed)."""
    f = _client().files.upload(file=path, purpose=purpose)  # type: ignore[arg-type]
    _emit(
        f,
        as_json,
        lambda f: _out().print(
            f"{f.id}  {f.filename}: {f.records} {f.format} records, {f.bytes} bytes"
        ),
    )


@_command(files_app, "list")
def files_list(
    purpose: Annotated[Optional[str], typer.Option(help="train or eval.")] = None,
    limit: LimitOpt = 20,
    as_json: JsonOpt = False,
) -> None:
    """List files, newest first."""
    client = _client()
    files = _first(lambda size: client.files.list(purpose=purpose, limit=size), limit)  # type: ignore[arg-type]
    _emit(files, as_json, _rows_table(FILE_COLUMNS, _file_rows))


_show_command(files_app, "file", lambda client, file_id: client.files.retrieve(file_id), _show_file)


@_command(files_app, "download")
def files_download(
    file_id: str,
    output: Annotated[
        Optional[Path], typer.Option("-o", "--output", help="Default: stdout.")
    ] = None,
) -> None:
    """Download a file's content."""
    client = _client()
    if output is None:
        sys.stdout.buffer.write(client.files.content(file_id))  # type: ignore[arg-type]
        sys.stdout.flush()
    else:
        client.files.content(file_id, to=output)
        _err().print(f"wrote {output}")


@_command(files_app, "delete")
def files_delete(file_id: str, as_json: JsonOpt = False) -> None:
    """Delete a file (refused while an active job trains on it)."""
    deleted = _client().files.delete(file_id)
    _emit(deleted, as_json, lambda deleted: _out().print(f"deleted {deleted.id}"))
