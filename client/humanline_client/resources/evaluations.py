"""`client.evaluations`: create, list, retrieve, report, export, wait.

An evaluation runs a job's final model, one of its checkpoints (`step`), or a base model on
an eval file (uploaded with purpose "eval"): instruction following judged pairwise against
the file's reference outputs (length-controlled win rate), or math checked with math-verify
(pass@1, pass@n). Evaluations have no event stream: `wait` polls.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .._exceptions import EvaluationWaitTimeout
from .._methods import AsyncReport, SyncReport, endpoint, paged, report_endpoint
from .._resource import (
    APIResource,
    AsyncAPIResource,
    Listing,
    PathLike,
    SyncAPIResource,
    path_id,
)
from .._retries import NOT_GIVEN, RequestOptions
from .._steps import Callback, Sleep, Steps
from ..types import (
    Evaluation,
    EvaluationKind,
    EvaluationReport,
    EvaluationStatus,
    GenerationParams,
    JudgeParams,
)

__all__ = ["AsyncEvaluations", "Evaluations"]

UpdateCallback = Callable[[Evaluation], Any]


def _report_path(evaluation_id: str) -> str:
    return f"/v1/evaluations/{path_id(evaluation_id, 'evaluation')}/report"


def _changed(before: Optional[Evaluation], after: Evaluation) -> bool:
    return before is None or (before.status, before.result) != (after.status, after.result)


class _Evaluations(APIResource):
    @endpoint
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
    ) -> Steps[Evaluation]:
        """Queue an evaluation on `file_id` (an eval file of the matching format) of exactly
        one of: `job_id` (its exported final model, or the checkpoint at `step`) or
        `base_model`. `kind="instruction"` needs a `judge` ({"type": "openai", "base_url":
        ..., "model": ...} at an operator-allowed URL, or {"type": "reward_model", "model":
        NAME}); `kind="math"` takes `prompt_template` (with "{problem}") and `system_prompt`.
        Invalid requests raise UnprocessableEntityError naming the `field`. Retries reuse
        one Idempotency-Key: one call, one evaluation."""
        body = self._create_body(locals())  # the keywords: no other local exists yet
        opts = RequestOptions(
            "POST", "/v1/evaluations", json=body, idempotency_key=idempotency_key, timeout=timeout
        )
        return (yield from self._call(Evaluation, opts))

    @paged
    def list(
        self,
        *,
        job_id: Optional[str] = None,
        status: Optional[Union[EvaluationStatus, str]] = None,
        kind: Optional[Union[EvaluationKind, str]] = None,
        limit: int = 20,
        after: Optional[str] = None,
    ) -> Listing[Evaluation]:
        """Evaluations, newest first, optionally of one job, in one status, of one kind.
        Lazy: iterate, or `.first_page()`; `limit` is the page size."""
        params = {"job_id": job_id, "status": status, "kind": kind, "limit": limit}
        return Listing("/v1/evaluations", Evaluation, {**params, "after": after})

    @endpoint
    def retrieve(self, evaluation_id: str) -> Steps[Evaluation]:
        path = f"/v1/evaluations/{path_id(evaluation_id, 'evaluation')}"
        return (yield from self._get(path, Evaluation))

    if not TYPE_CHECKING:  # typed per twin below (the result depends on format and to)
        report = report_endpoint(
            "evaluation_id",
            _report_path,
            EvaluationReport,
            """The full result of a succeeded evaluation, every item included: an
            EvaluationReport (`format="json"`), the self-contained HTML page as a str
            (`format="html"`), or with `to=` streamed into that file and its Path returned.
            ConflictError until the evaluation has succeeded.""",
        )

    @endpoint
    def export(
        self,
        evaluation_id: str,
        *,
        format: str,
        part: str = "all",
        name: Optional[str] = None,
        task: Optional[str] = None,
        to: Optional[PathLike] = None,
    ) -> Steps[Any]:
        """A succeeded evaluation in the field's formats, with its judge, baseline, decoding
        parameters and truncated answers (`provenance`). `format="alpaca_eval"` (instruction
        evaluations): `part="all"` a dict (model_outputs, leaderboard, provenance),
        `"model_outputs"` the list AlpacaEval's --model_outputs reads, `"leaderboard"` its
        leaderboard.csv (a str). `format="lighteval"` (math): lighteval's results file (a
        dict), the metrics under results["humanline|{task}|0"] (`task` default math_500).
        `name` names the generator; with `to=` the response is written to that file and its
        Path returned. ConflictError until it has succeeded, or for the other kind."""
        params = {"format": format, "part": part}
        params.update({k: v for k, v in (("name", name), ("task", task)) if v is not None})
        path = f"/v1/evaluations/{path_id(evaluation_id, 'evaluation')}/export"
        opts = RequestOptions("GET", path, params=params)
        if to is not None:
            written = yield from self._download(opts, to)
            return Path(written) if isinstance(written, Path) else written
        response = yield from self._client._request_steps(opts)
        return response.text if part == "leaderboard" else response.json()

    @endpoint
    def wait(
        self,
        evaluation_id: str,
        *,
        timeout: Optional[float] = None,
        poll_interval: float = 2.0,
        on_update: Optional[UpdateCallback] = None,
    ) -> Steps[Evaluation]:
        """Poll every `poll_interval` seconds until the evaluation succeeds, fails or is
        cancelled, and return it (check `status`; failures are not raised). `on_update` sees
        the evaluation each time its status or result (progress) changes (on AsyncClient it
        may be a coroutine function). Raises EvaluationWaitTimeout after `timeout` seconds
        (the evaluation goes on)."""
        if poll_interval <= 0:
            raise ValueError("poll_interval must be > 0")
        deadline = None if timeout is None else time.monotonic() + timeout
        last: Optional[Evaluation] = None
        while True:
            evaluation = yield from _Evaluations.retrieve.steps(self, evaluation_id)
            if on_update is not None and _changed(last, evaluation):
                yield Callback(on_update, evaluation)
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
            yield Sleep(delay)


class Evaluations(_Evaluations, SyncAPIResource):
    """`client.evaluations`: create, list, retrieve, report, wait."""

    if TYPE_CHECKING:
        report: SyncReport[EvaluationReport]


class AsyncEvaluations(_Evaluations, AsyncAPIResource):
    """`aclient.evaluations`: the same methods, awaited."""

    if TYPE_CHECKING:
        report: AsyncReport[EvaluationReport]
