"""`client.reports`: compare jobs (the paper's Figure 1: one bar per variant, grouped by
objective, from each job's newest succeeded evaluation, with z-tests of its claims).

A single job's report is `client.jobs.report(id)`; an evaluation's is
`client.evaluations.report(id)`.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from .._methods import CompareMethod, endpoint
from .._resource import APIResource, AsyncAPIResource, PathLike, SyncAPIResource, report_options
from .._steps import Steps
from ..types import CompareMetric, Comparison, ReportFormat

__all__ = ["AsyncReports", "JobRefs", "Reports"]

# Job ids, or objects with an `id` (Job), or one comma-separated string.
JobRefs = Union[str, Iterable[Union[str, Any]]]


def _job_ids(jobs: JobRefs) -> str:
    items = jobs.split(",") if isinstance(jobs, str) else list(jobs)
    ids = []
    for item in items:
        value = item if isinstance(item, str) else getattr(item, "id", None)
        if not isinstance(value, str):
            raise TypeError(f"jobs must be job ids or Job objects, not {type(item).__name__}")
        if value.strip():
            ids.append(value.strip())
    if not ids:
        raise ValueError("name at least one job to compare")
    return ",".join(ids)


def _compare_options(
    jobs: JobRefs,
    format: str,
    metric: Optional[str],
    file_id: Optional[str],
    group_by: Optional[str] = None,
) -> Any:
    return report_options(
        "/v1/reports/compare",
        format,
        {"jobs": _job_ids(jobs), "metric": metric, "file_id": file_id, "group_by": group_by},
    )


class _Reports(APIResource):
    if not TYPE_CHECKING:  # typed per twin below (the result depends on format and to)

        @endpoint
        def compare(
            self,
            *,
            jobs: JobRefs,
            format: Union[ReportFormat, str] = "json",
            metric: Optional[Union[CompareMetric, str]] = None,
            file_id: Optional[str] = None,
            group_by: Optional[str] = None,
            to: Optional[PathLike] = None,
        ) -> Steps[Union[Comparison, str, Path]]:
            """Compare jobs (ids or Job objects, up to 50) on `metric` (default lc_win_rate;
            pass_at_1 for math), optionally only evaluations on `file_id`: a Comparison
            (`format="json"`, rows in the order given), the HTML page with the bar chart as
            a str (`format="html"`), or with `to=` written to that file and its Path
            returned. NotFoundError names the first job that is not yours. `group_by`, a
            metadata key: the jobs grouped by its value (a study's arms), each group's
            `metric` per evaluated checkpoint as mean ± SE, against steps and against
            completions sampled (`Comparison.groups`)."""
            opts = _compare_options(jobs, format, metric, file_id, group_by)
            return (yield from self._report(opts, format, Comparison, to))


class Reports(_Reports, SyncAPIResource):
    """`client.reports`: compare."""

    if TYPE_CHECKING:
        compare: CompareMethod[Comparison, str, Path]


class AsyncReports(_Reports, AsyncAPIResource):
    """`aclient.reports`: compare, awaited."""

    if TYPE_CHECKING:
        compare: CompareMethod[
            Coroutine[Any, Any, Comparison], Coroutine[Any, Any, str], Coroutine[Any, Any, Path]
        ]
