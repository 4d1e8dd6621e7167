"""`python -m trainer run SPEC.yaml --out DIR [--resume]`: run one job spec standalone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from contract.runs import EXIT_INVALID_SPEC, EXIT_OK, EXIT_OUT_OF_MEMORY, EXIT_STOPPED

# Plain tracebacks: the worker reports the last stderr line as the job's error message.
app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Run Humanline training jobs without the service.",
)


@app.command()
def run(
    spec_ref: str = typer.Argument(
        ..., metavar="SPEC", help="Job spec (YAML or JSON): a path or an s3:// URL."
    ),
    out: Path = typer.Option(..., "--out", help="Run directory: metrics, events, checkpoints."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the newest committed checkpoint."
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
    checkpoints: str | None = typer.Option(
        None, "--checkpoints", help="Checkpoint root: a directory or URL (default OUT/checkpoints)."
    ),
    final: str | None = typer.Option(
        None, "--final", help="Where the exported model is published (a directory or URL)."
    ),
    runlog: str | None = typer.Option(
        None, "--runlog", help="URL rank 0 mirrors its run log to (a rank with no shared disk)."
    ),
) -> None:
    """Train SPEC into OUT; with --resume continue from the newest committed checkpoint."""
    import contextlib
    import os

    from pydantic import ValidationError

    from contract.spec import load_spec
    from trainer.remote import RunLogMirror, localize_spec

    try:
        spec_path = localize_spec(spec_ref, out / "inputs")
    except (OSError, ValueError) as exc:  # a missing spec or data object: not worth retrying
        typer.echo(f"cannot read spec {spec_ref}: {exc}", err=True)
        raise typer.Exit(EXIT_INVALID_SPEC) from None
    if not spec_path.is_file():
        typer.echo(f"invalid spec {spec_ref}: no such file", err=True)
        raise typer.Exit(EXIT_INVALID_SPEC)
    try:
        spec = load_spec(spec_path)
    except ValidationError as exc:
        typer.echo(f"invalid spec {spec_path}:\n{exc}", err=True)
        raise typer.Exit(EXIT_INVALID_SPEC) from None
    from trainer.memory import OutOfMemoryRetry
    from trainer.train import train  # torch: only once the spec is known to be valid

    out.mkdir(parents=True, exist_ok=True)
    mirror = (
        RunLogMirror(out, runlog)
        if runlog and os.environ.get("RANK", "0") == "0"
        else contextlib.nullcontext()
    )
    try:
        with mirror:
            result = train(
                spec, out, resume=resume, progress=progress, checkpoints=checkpoints, final=final
            )
    except OutOfMemoryRetry as exc:  # several processes: the next attempt splits the batch finer
        typer.echo(f"out of memory: {exc}", err=True)
        raise typer.Exit(EXIT_OUT_OF_MEMORY) from None
    typer.echo(json.dumps(result.as_dict()))
    raise typer.Exit(EXIT_OK if result.status == "succeeded" else EXIT_STOPPED)


@app.command()
def validate(spec_path: Path = typer.Argument(..., exists=True, dir_okay=False)) -> None:
    """Check a spec without training; print it with every default resolved."""
    from contract.spec import load_spec

    spec = load_spec(spec_path)
    typer.echo(spec.resolved().model_dump_json(indent=2))


if __name__ == "__main__":
    sys.exit(app())
