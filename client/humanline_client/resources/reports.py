"""`client.reports`: compare jobs (the paper's Figure 1: one bar per variant, grouped by
objective, from each job's newest succeeded evaluation, with z-tests of its claims).

A single job's report is `client.jobs.report(id)`; an evaluation's is
`client.evaluations.report(id)`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional, Union, overload

try:
    from typing import Literal
except ImportError:  # pragma: no cover
    from typing_extensions import Literal  # type: ignore[assignment]

from .._resource import AsyncAPIResource, PathLike, SyncAPIResource, report_options
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
    jobs: JobRefs, format: str, metric: Optional[str], file_id: Optional[str]
) -> Any:
    return report_options(
        "/v1/reports/compare",
        format,
        {"jobs": _job_ids(jobs), "metric": metric, "file_id": file_id},
    )


class Reports(SyncAPIResource):
    @overload
    def compare(
        self,
        *,
        jobs: JobRefs,
        format: Literal["json"] = ...,
        metric: Optional[Union[CompareMetric, str]] = ...,
        file_id: Optional[str] = ...,
        to: None = ...,
    ) -> Comparison: ...
    @overload
    def compare(
        self,
        *,
        jobs: JobRefs,
        format: Literal["html"],
        metric: Optional[Union[CompareMetric, str]] = ...,
        file_id: Optional[str] = ...,
        to: None = ...,
    ) -> str: ...
    @overload
    def compare(
        self,
        *,
        jobs: JobRefs,
        format: Union[ReportFormat, str] = ...,
        metric: Optional[Union[CompareMetric, str]] = ...,
        file_id: Optional[str] = ...,
        to: PathLike,
    ) -> Path: ...
    def compare(
        self,
        *,
        jobs: JobRefs,
        format: Union[ReportFormat, str] = "json",
        metric: Optional[Union[CompareMetric, str]] = None,
        file_id: Optional[str] = None,
        to: Optional[PathLike] = None,
    ) -> Union[Comparison, str, Path]:
        """Compare jobs (ids or Job objects, up to 50) on `metric` (default lc_win_rate;
        pass_at_1 for math), optionally only evaluations on `file_id`: a Comparison
        (`format="json"`, rows in the order given), the HTML page with the bar chart as a
        str (`format="html"`), or with `to=` written to that file and its Path returned.
        NotFoundError names the first job that is not yours."""
        opts = _compare_options(jobs, format, metric, file_id)
        return self._report(opts, format, Comparison, to)


class AsyncReports(AsyncAPIResource):
    @overload
    async def compare(
        self,
        *,
        jobs: JobRefs,
        format: Literal["json"] = ...,
        metric: Optional[Union[CompareMetric, str]] = ...,
        file_id: Optional[str] = ...,
        to: None = ...,
    ) -> Comparison: ...
    @overload
    async def compare(
        self,
        *,
        jobs: JobRefs,
        format: Literal["html"],
        metric: Optional[Union[CompareMetric, str]] = ...,
        file_id: Optional[str] = ...,
        to: None = ...,
    ) -> str: ...
    @overload
    async def compare(
        self,
        *,
        jobs: JobRefs,
        format: Union[ReportFormat, str] = ...,
        metric: Optional[Union[CompareMetric, str]] = ...,
        file_id: Optional[str] = ...,
        to: PathLike,
    ) -> Path: ...
    async def compare(
        self,
        *,
        jobs: JobRefs,
        format: Union[ReportFormat, str] = "json",
        metric: Optional[Union[CompareMetric, str]] = None,
        file_id: Optional[str] = None,
        to: Optional[PathLike] = None,
    ) -> Union[Comparison, str, Path]:
        """See Reports.compare."""
        opts = _compare_options(jobs, format, metric, file_id)
        return await self._report(opts, format, Comparison, to)
