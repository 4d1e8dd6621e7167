"""`client.evaluations`: create, list, retrieve, report, wait.

An evaluation runs a job's final model, one of its checkpoints (`step`), or a base model on
an eval file (uploaded with purpose "eval"): instruction following judged pairwise against
the file's reference outputs (length-controlled win rate), or math checked with math-verify
(pass@1, pass@n). Evaluations have no event stream: `wait` polls.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional, Union, overload

import anyio

try:
    from typing import Literal
except ImportError:  # pragma: no cover
    from typing_extensions import Literal  # type: ignore[assignment]

from .._base_client import NOT_GIVEN, RequestOptions
from .._exceptions import EvaluationWaitTimeout
from .._resource import AsyncAPIResource, PathLike, SyncAPIResource, path_id, report_options
from ..pagination import AsyncPaginator, SyncPaginator
from ..types import (
    Evaluation,
    EvaluationKind,
    EvaluationReport,
    EvaluationStatus,
    GenerationParams,
    JudgeParams,
    ReportFormat,
)

__all__ = ["AsyncEvaluations", "Evaluations"]

UpdateCallback = Callable[[Evaluation], Any]


def _evaluation_body(
    *, extra_body: Optional[Mapping[str, Any]] = None, **fields: Any
) -> dict[str, Any]:
    """The request to POST: only what the caller set (the server fills in the kind's
    defaults, and the idempotency hash covers exactly this)."""
    body: dict[str, Any] = {}
    for name, value in fields.items():
        if value is not None:
            body[name] = dict(value) if isinstance(value, Mapping) else value
    body.update(extra_body or {})
    return body


def _list_params(
    job_id: Optional[str],
    status: Optional[str],
    kind: Optional[str],
    limit: int,
    after: Optional[str],
) -> dict[str, Any]:
    return {"job_id": job_id, "status": status, "kind": kind, "limit": limit, "after": after}


def _report_path(evaluation_id: str) -> str:
    return f"/v1/evaluations/{path_id(evaluation_id, 'evaluation')}/report"


def _changed(before: Optional[Evaluation], after: Evaluation) -> bool:
    return before is None or (before.status, before.result) != (after.status, after.result)


class Evaluations(SyncAPIResource):
    def create(
        self,
        *,
        file_id: str,
        kind: Union[EvaluationKind, str],
        job_id: Optional[str] = None,
        step: Optional[int] = None,
        base_model: Optional[str] = None,
        judge: Optional[JudgeParams] = None,
        generation: Optional[GenerationParams] = None,
        prompt_template: Optional[str] = None,
        system_prompt: Optional[str] = None,
        max_items: Optional[int] = None,
        extra_body: Optional[Mapping[str, Any]] = None,
        idempotency_key: Optional[str] = None,
        timeout: Any = NOT_GIVEN,
    ) -> Evaluation:
        """Queue an evaluation on `file_id` (an eval file of the matching format) of exactly
        one of: `job_id` (its exported final model, or the checkpoint at `step`) or
        `base_model`. `kind="instruction"` needs a `judge` ({"type": "openai", "base_url":
        ..., "model": ...} at an operator-allowed URL, or {"type": "reward_model", "model":
        NAME}); `kind="math"` takes `prompt_template` (with "{problem}") and `system_prompt`.
        Invalid requests raise UnprocessableEntityError naming the `field`. Retries reuse
        one Idempotency-Key: one call, one evaluation."""
        body = _evaluation_body(
            extra_body=extra_body,
            job_id=job_id,
            step=step,
            base_model=base_model,
            file_id=file_id,
            kind=kind,
            judge=judge,
            generation=generation,
            prompt_template=prompt_template,
            system_prompt=system_prompt,
            max_items=max_items,
        )
        return self._client._call(
            Evaluation,
            RequestOptions(
                "POST",
                "/v1/evaluations",
                json=body,
                idempotency_key=idempotency_key,
                timeout=timeout,
            ),
        )

    def list(
        self,
        *,
        job_id: Optional[str] = None,
        status: Optional[Union[EvaluationStatus, str]] = None,
        kind: Optional[Union[EvaluationKind, str]] = None,
        limit: int = 20,
        after: Optional[str] = None,
    ) -> SyncPaginator[Evaluation]:
        """Evaluations, newest first, optionally of one job, in one status, of one kind.
        Lazy: iterate, or `.first_page()`; `limit` is the page size."""
        return self._paginate(
            "/v1/evaluations", Evaluation, _list_params(job_id, status, kind, limit, after)
        )

    def retrieve(self, evaluation_id: str) -> Evaluation:
        return self._client._get(
            f"/v1/evaluations/{path_id(evaluation_id, 'evaluation')}", Evaluation
        )

    @overload
    def report(
        self, evaluation_id: str, *, format: Literal["json"] = ..., to: None = ...
    ) -> EvaluationReport: ...
    @overload
    def report(self, evaluation_id: str, *, format: Literal["html"], to: None = ...) -> str: ...
    @overload
    def report(
        self, evaluation_id: str, *, format: Union[ReportFormat, str] = ..., to: PathLike
    ) -> Path: ...
    def report(
        self,
        evaluation_id: str,
        *,
        format: Union[ReportFormat, str] = "json",
        to: Optional[PathLike] = None,
    ) -> Union[EvaluationReport, str, Path]:
        """The full result of a succeeded evaluation, every item included: an
        EvaluationReport (`format="json"`), the self-contained HTML page as a str
        (`format="html"`), or with `to=` streamed into that file and its Path returned.
        ConflictError until the evaluation has succeeded."""
        opts = report_options(_report_path(evaluation_id), format)
        return self._report(opts, format, EvaluationReport, to)

    def wait(
        self,
        evaluation_id: str,
        *,
        timeout: Optional[float] = None,
        poll_interval: float = 2.0,
        on_update: Optional[UpdateCallback] = None,
    ) -> Evaluation:
        """Poll every `poll_interval` seconds until the evaluation succeeds, fails or is
        cancelled, and return it (check `status`; failures are not raised). `on_update` sees
        the evaluation each time its status or result (progress) changes. Raises
        EvaluationWaitTimeout after `timeout` seconds (the evaluation goes on)."""
        if poll_interval <= 0:
            raise ValueError("poll_interval must be > 0")
        deadline = None if timeout is None else time.monotonic() + timeout
        last: Optional[Evaluation] = None
        while True:
            evaluation = self.retrieve(evaluation_id)
            if on_update is not None and _changed(last, evaluation):
                on_update(evaluation)
            last = evaluation
            if evaluation.is_terminal:
                return evaluation
            delay = poll_interval
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EvaluationWaitTimeout(
                        f"evaluation {evaluation_id} is still {evaluation.status} after "
                        f"{timeout:g} s",
                        evaluation=evaluation,
                    )
                delay = min(delay, left)
            time.sleep(delay)


class AsyncEvaluations(AsyncAPIResource):
    async def create(
        self,
        *,
        file_id: str,
        kind: Union[EvaluationKind, str],
        job_id: Optional[str] = None,
        step: Optional[int] = None,
        base_model: Optional[str] = None,
        judge: Optional[JudgeParams] = None,
        generation: Optional[GenerationParams] = None,
        prompt_template: Optional[str] = None,
        system_prompt: Optional[str] = None,
        max_items: Optional[int] = None,
        extra_body: Optional[Mapping[str, Any]] = None,
        idempotency_key: Optional[str] = None,
        timeout: Any = NOT_GIVEN,
    ) -> Evaluation:
        body = _evaluation_body(
            extra_body=extra_body,
            job_id=job_id,
            step=step,
            base_model=base_model,
            file_id=file_id,
            kind=kind,
            judge=judge,
            generation=generation,
            prompt_template=prompt_template,
            system_prompt=system_prompt,
            max_items=max_items,
        )
        return await self._client._call(
            Evaluation,
            RequestOptions(
                "POST",
                "/v1/evaluations",
                json=body,
                idempotency_key=idempotency_key,
                timeout=timeout,
            ),
        )

    def list(
        self,
        *,
        job_id: Optional[str] = None,
        status: Optional[Union[EvaluationStatus, str]] = None,
        kind: Optional[Union[EvaluationKind, str]] = None,
        limit: int = 20,
        after: Optional[str] = None,
    ) -> AsyncPaginator[Evaluation]:
        return self._paginate(
            "/v1/evaluations", Evaluation, _list_params(job_id, status, kind, limit, after)
        )

    async def retrieve(self, evaluation_id: str) -> Evaluation:
        return await self._client._get(
            f"/v1/evaluations/{path_id(evaluation_id, 'evaluation')}", Evaluation
        )

    @overload
    async def report(
        self, evaluation_id: str, *, format: Literal["json"] = ..., to: None = ...
    ) -> EvaluationReport: ...
    @overload
    async def report(
        self, evaluation_id: str, *, format: Literal["html"], to: None = ...
    ) -> str: ...
    @overload
    async def report(
        self, evaluation_id: str, *, format: Union[ReportFormat, str] = ..., to: PathLike
    ) -> Path: ...
    async def report(
        self,
        evaluation_id: str,
        *,
        format: Union[ReportFormat, str] = "json",
        to: Optional[PathLike] = None,
    ) -> Union[EvaluationReport, str, Path]:
        """See Evaluations.report."""
        opts = report_options(_report_path(evaluation_id), format)
        return await self._report(opts, format, EvaluationReport, to)

    async def wait(
        self,
        evaluation_id: str,
        *,
        timeout: Optional[float] = None,
        poll_interval: float = 2.0,
        on_update: Optional[UpdateCallback] = None,
    ) -> Evaluation:
        """See Evaluations.wait; `on_update` may be a plain function or a coroutine
        function."""
        if poll_interval <= 0:
            raise ValueError("poll_interval must be > 0")
        deadline = None if timeout is None else time.monotonic() + timeout
        last: Optional[Evaluation] = None
        while True:
            evaluation = await self.retrieve(evaluation_id)
            if on_update is not None and _changed(last, evaluation):
                result = on_update(evaluation)
                if hasattr(result, "__await__"):
                    await result
            last = evaluation
            if evaluation.is_terminal:
                return evaluation
            delay = poll_interval
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EvaluationWaitTimeout(
                        f"evaluation {evaluation_id} is still {evaluation.status} after "
                        f"{timeout:g} s",
                        evaluation=evaluation,
                    )
                delay = min(delay, left)
            await anyio.sleep(delay)
