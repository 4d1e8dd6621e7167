"""`humanline evals`: create, list, show, wait, report, export."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .._client import Client
from ..types import Evaluation, EvaluationReport
from ._app import (
    FileOpt,
    HtmlOpt,
    JsonOpt,
    LimitOpt,
    OpenOpt,
    PollOpt,
    SetOpt,
    SpecOpt,
    StatusOpt,
    TimeoutOpt,
    WaitOpt,
    evals_app,
)
from ._output import (
    _apply_sets,
    _client,
    _command,
    _created,
    _emit,
    _err,
    _finished,
    _first,
    _headline,
    _load_spec,
    _metric,
    _out,
    _print_json,
    _report,
    _require,
    _rows_table,
    _show_command,
    _table,
    _target,
    _upload_local,
    _when,
)

EVAL_COLUMNS = ["ID", "STATUS", "KIND", "MODEL", "RESULT", "CREATED"]
KindOpt = Annotated[Optional[str], typer.Option(help="instruction or math.")]


def _eval_rows(evals: Iterable[Evaluation]) -> list[list[Any]]:
    return [
        [e.id, e.status, e.kind, _target(e), _headline(e.kind, e.metrics), _when(e.created_at)]
        for e in evals
    ]


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
    ran = (ev.result or {}).get("generation") or {}  # what the run recorded (a finished one)
    if ran.get("device"):
        rows.append(["generated on", f"{ran['device']} ({ran.get('engine', 'hf')} engine)"])
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
    _finished(ev, as_json, f"{ev.id} {ev.status}: {_headline(ev.kind, ev.metrics)}")


@_command(evals_app, "create")
def evals_create(
    file: FileOpt = None,
    kind: KindOpt = None,
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
    set_: SetOpt = None,
    spec: SpecOpt = None,
    wait: WaitOpt = False,
    poll_interval: PollOpt = 2.0,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate a job or a base model on an eval file.

    --job evaluates the job's final model, --job with --step one of its checkpoints, --model
    a base model. Instruction evaluations need a judge (--judge-url and --judge-model, or
    --reward-model); --file may be a local JSONL path (uploaded with purpose eval)."""
    client = _client()
    body: dict[str, Any] = _load_spec(spec) if spec else {}
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
    _upload_local(client, body, "file_id", "eval")
    _require(body, {"file_id": "--file", "kind": "--kind"})
    ev = client.evaluations.create(
        file_id=body.pop("file_id"), kind=body.pop("kind"), extra_body=body
    )
    _created(
        ev,
        as_json,
        (lambda: _wait_for_eval(client, ev.id, as_json, None, poll_interval)) if wait else None,
        f"created {ev.id} ({ev.kind}, {_target(ev)}): {ev.status}\n"
        f"follow it with: humanline evals wait {ev.id}",
    )


@_command(evals_app, "list")
def evals_list(
    job: Annotated[Optional[str], typer.Option("--job", help="Only this job's.")] = None,
    status: StatusOpt = None,
    kind: KindOpt = None,
    limit: LimitOpt = 20,
    as_json: JsonOpt = False,
) -> None:
    """List evaluations, newest first."""
    client = _client()
    evals = _first(
        lambda size: client.evaluations.list(job_id=job, status=status, kind=kind, limit=size),
        limit,
    )
    _emit(evals, as_json, _rows_table(EVAL_COLUMNS, _eval_rows))


_show_command(
    evals_app,
    "evaluation",
    lambda client, eval_id: client.evaluations.retrieve(eval_id),
    _show_eval,
)


@_command(evals_app, "wait")
def evals_wait(
    eval_id: str,
    timeout: TimeoutOpt = None,
    poll_interval: PollOpt = 2.0,
    as_json: JsonOpt = False,
) -> None:
    """Wait for an evaluation to finish; exit 1 unless it succeeded."""
    _wait_for_eval(_client(), eval_id, as_json, timeout, poll_interval)


@_command(evals_app, "report")
def evals_report(
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
    fetch = functools.partial(_client().evaluations.report, eval_id)
    if output is not None:
        fetch(to=output)
        _err().print(f"wrote {output}", markup=False)
    _report(fetch, eval_id, html, open_, as_json, _show_eval_report, saved=output is not None)


def _show_eval_report(report: EvaluationReport) -> None:
    out = _out()
    rows = [[name, _metric(value)] for name, value in report.metrics.items()]
    out.print(_table(["METRIC", "VALUE"], rows))
    out.print(f"{len(report.items)} items (--json or -o FILE for each one)", markup=False)


@_command(evals_app, "export")
def evals_export(
    eval_id: str,
    format: Annotated[
        str, typer.Option("--format", help="alpaca_eval (instruction) or lighteval (math).")
    ],
    part: Annotated[
        str,
        typer.Option(help="alpaca_eval: all, model_outputs (model_outputs.json) or leaderboard."),
    ] = "all",
    name: Annotated[
        Optional[str], typer.Option(help="The generator's name (default: job[@step-N]).")
    ] = None,
    task: Annotated[
        Optional[str], typer.Option(help="lighteval: the task name (default math_500).")
    ] = None,
    output: Annotated[
        Optional[Path], typer.Option("-o", "--output", help="Save it to this file.")
    ] = None,
) -> None:
    """A succeeded evaluation in AlpacaEval's or lighteval's format, with its judge,
    baseline, decoding parameters and truncated answers; printed, or saved with -o."""
    result = _client().evaluations.export(
        eval_id, format=format, part=part, name=name, task=task, to=output
    )
    if output is not None:
        _err().print(f"wrote {output}", markup=False)
    elif isinstance(result, str):
        typer.echo(result, nl=False)
    else:
        _print_json(result)
