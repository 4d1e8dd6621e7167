"""`humanline reports compare`: jobs side by side on an evaluation metric."""

from __future__ import annotations

import functools
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ..types import Comparison
from ._app import HtmlOpt, JsonOpt, OpenOpt, reports_app
from ._output import (
    _client,
    _command,
    _err,
    _fmt,
    _metric,
    _out,
    _report,
    _table,
)


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
    if doc.groups is not None:
        out.print(
            _table(
                [doc.groups.key.upper(), "JOBS", f"FINAL {doc.metric.upper()} (MEAN ± SE)"],
                [
                    [
                        g.group,
                        len(g.jobs),
                        _metric({"value": g.final.get("mean"), "se": g.final.get("se")}),
                    ]
                    for g in doc.groups.groups
                ],
            )
        )
    for warning in ([doc.fallback] if doc.fallback else []) + list(doc.warnings):
        _err().print(f"[yellow]warning:[/yellow] {escape(str(warning))}")


@_command(reports_app, "compare")
def reports_compare(
    jobs: Annotated[list[str], typer.Argument(help="Job ids (or one comma-separated list).")],
    metric: Annotated[
        Optional[str],
        typer.Option(help="lc_win_rate (default), win_rate, pass_at_1, pass_at_n, ..."),
    ] = None,
    file_id: Annotated[
        Optional[str], typer.Option("--file-id", help="Only evaluations on this eval file.")
    ] = None,
    group_by: Annotated[
        Optional[str],
        typer.Option(
            "--group-by", help="A metadata key: each group's mean ± SE per checkpoint (bands)."
        ),
    ] = None,
    html: HtmlOpt = None,
    open_: OpenOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Compare jobs on an evaluation metric (the paper's Figure 1).

    One row per job (its newest succeeded evaluation reporting the metric), and z-tests of
    offline+humanline vs offline and online vs offline+humanline per objective. --html FILE
    saves the page with the bar chart, --open shows it in a browser."""
    ids = [j for item in jobs for j in item.split(",") if j.strip()]
    compare = _client().reports.compare
    fetch = functools.partial(compare, jobs=ids, metric=metric, file_id=file_id, group_by=group_by)
    _report(fetch, "comparison", html, open_, as_json, _show_comparison)
