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
    spec_path: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="Job spec (YAML or JSON)."
    ),
    out: Path = typer.Option(..., "--out", help="Run directory: metrics, events, checkpoints."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the newest checkpoint in --out."
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Train SPEC into OUT; with --resume continue from OUT's newest complete checkpoint."""
    from pydantic import ValidationError

    from contract.spec import load_spec

    try:
        spec = load_spec(spec_path)
    except ValidationError as exc:
        typer.echo(f"invalid spec {spec_path}:\n{exc}", err=True)
        raise typer.Exit(EXIT_INVALID_SPEC) from None
    from trainer.memory import OutOfMemoryRetry
    from trainer.train import train  # torch: only once the spec is known to be valid

    try:
        result = train(spec, out, resume=resume, progress=progress)
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
