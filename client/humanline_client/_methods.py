"""The decorators that let each resource method be written once for `Client` and
`AsyncClient`:

    class _Jobs(APIResource):
        @endpoint
        def retrieve(self, job_id: str) -> Steps[Job]:      # the steps of the call (_steps)
            return (yield from self._get(f"/v1/jobs/{job_id}", Job))

        @paged
        def events(self, job_id: str) -> Listing[JobEvent]:  # a lazy listing
            return Listing(f"/v1/jobs/{job_id}/events", JobEvent, {})

    class Jobs(_Jobs, SyncAPIResource): ...       # client.jobs.retrieve(id) -> Job
    class AsyncJobs(_Jobs, AsyncAPIResource): ... # await aclient.jobs.retrieve(id) -> Job

The typed signature, the docstring and the behaviour are the same object on both sides;
tests/client/test_twins.py checks that every public method exists on both twins with one
signature.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Callable, Generic, Literal, Optional, TypeVar, Union, cast, overload

from typing_extensions import Concatenate, ParamSpec, Protocol

from ._resource import (
    APIResource,
    AsyncAPIResource,
    Listing,
    PathLike,
    SyncAPIResource,
    report_options,
)
from ._steps import Steps
from .pagination import AsyncPaginator, SyncPaginator

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


def _bound(fn: Callable[..., Any], steps: Callable[..., Any], wrap: str = "") -> Callable[..., Any]:
    """`fn` dressed as the method `steps` describes: name, docstring, and the signature
    without `self` and with what the call returns (help() and IDEs show `-> Job`)."""
    functools.update_wrapper(fn, steps)
    del fn.__wrapped__  # type: ignore[attr-defined]
    signature = inspect.signature(steps)
    returns = signature.return_annotation
    if isinstance(returns, str) and returns.startswith(("Steps[", "Listing[")):
        returns = returns[returns.index("[") + 1 : -1]
        returns = f"{wrap}[{returns}]" if wrap else returns
    fn.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=list(signature.parameters.values())[1:], return_annotation=returns
    )
    return fn


class endpoint(Generic[P, R]):
    """A method written once as steps: on a SyncAPIResource it returns R, on an
    AsyncAPIResource it returns a coroutine of R."""

    def __init__(self, steps: Callable[Concatenate[Any, P], Steps[R]]) -> None:
        self.steps = steps
        functools.update_wrapper(self, steps)  # type: ignore[arg-type]

    @overload
    def __get__(self, obj: None, owner: Any) -> endpoint[P, R]: ...
    @overload
    def __get__(self, obj: AsyncAPIResource, owner: Any) -> Callable[P, Coroutine[Any, Any, R]]: ...
    @overload
    def __get__(self, obj: SyncAPIResource, owner: Any) -> Callable[P, R]: ...
    def __get__(self, obj: Any, owner: Any) -> Any:
        return self if obj is None else self._bind(obj)

    def _bind(self, obj: Any) -> Callable[..., Any]:
        steps, client = self.steps, obj._client
        if isinstance(obj, AsyncAPIResource):

            async def call(*args: Any, **kwargs: Any) -> Any:
                return await client._run(steps(obj, *args, **kwargs))

            return _bound(call, steps)
        return _bound(lambda *args, **kwargs: client._run(steps(obj, *args, **kwargs)), steps)


class paged(Generic[P, T]):
    """A listing method: a SyncPaginator on a SyncAPIResource, an AsyncPaginator on an
    AsyncAPIResource (both lazy: nothing is sent until it is iterated)."""

    def __init__(self, describe: Callable[Concatenate[Any, P], Listing[T]]) -> None:
        self.describe = describe
        functools.update_wrapper(self, describe)  # type: ignore[arg-type]

    @overload
    def __get__(self, obj: None, owner: Any) -> paged[P, T]: ...
    @overload
    def __get__(self, obj: AsyncAPIResource, owner: Any) -> Callable[P, AsyncPaginator[T]]: ...
    @overload
    def __get__(self, obj: SyncAPIResource, owner: Any) -> Callable[P, SyncPaginator[T]]: ...
    def __get__(self, obj: Any, owner: Any) -> Any:
        if obj is None:
            return self
        describe = self.describe
        wrap = "AsyncPaginator" if isinstance(obj, AsyncAPIResource) else "SyncPaginator"
        return _bound(
            lambda *args, **kwargs: obj._paginate(describe(obj, *args, **kwargs)), describe, wrap
        )


class twin(endpoint[P, R]):
    """A method whose blocking and awaiting implementations differ (`jobs.wait` follows a
    stream beside a poller: a thread, or a task group) behind one signature and docstring:

        @twin.of(wait_sync, wait_async)
        def wait(self, job_id: str, *, timeout: Optional[float] = None) -> Job:
            "docstring"

    Each implementation is called as impl(resource, **arguments), every argument bound
    and defaulted by the signature above (which is the only place the defaults live)."""

    def __init__(
        self,
        spec: Callable[Concatenate[Any, P], R],
        sync: Callable[..., R],
        aio: Callable[..., Coroutine[Any, Any, R]],
    ) -> None:
        self.steps, self.spec, self.sync, self.aio = spec, spec, sync, aio  # type: ignore[assignment]
        self.signature = inspect.signature(spec)
        functools.update_wrapper(self, spec)  # type: ignore[arg-type]

    @classmethod
    def of(
        cls, sync: Callable[..., R], aio: Callable[..., Coroutine[Any, Any, R]]
    ) -> Callable[[Callable[Concatenate[Any, P], R]], twin[P, R]]:
        return lambda spec: cls(spec, sync, aio)

    def _bind(self, obj: Any) -> Callable[..., Any]:
        impl = self.aio if isinstance(obj, AsyncAPIResource) else self.sync
        signature = self.signature

        def call(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(obj, *args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            arguments.pop(next(iter(signature.parameters)))
            return impl(obj, **arguments)

        if isinstance(obj, AsyncAPIResource):

            async def acall(*args: Any, **kwargs: Any) -> Any:
                return await call(*args, **kwargs)

            return _bound(acall, self.spec)
        return _bound(call, self.spec)


# --- the typed shapes of report methods (their return type depends on `format` and `to`) ---

J_co = TypeVar("J_co", covariant=True)
Hm_co = TypeVar("Hm_co", covariant=True)
Pt_co = TypeVar("Pt_co", covariant=True)
Format = Union[Literal["json", "html"], str]


class ReportMethod(Protocol[J_co, Hm_co, Pt_co]):
    """`report(id)`: J_co for JSON, Hm_co for `format="html"`, Pt_co with `to=` a path."""

    @overload
    def __call__(self, id: str, /, *, format: Literal["json"] = ..., to: None = ...) -> J_co: ...
    @overload
    def __call__(self, id: str, /, *, format: Literal["html"], to: None = ...) -> Hm_co: ...
    @overload
    def __call__(self, id: str, /, *, format: Format = ..., to: PathLike) -> Pt_co: ...


M = TypeVar("M")
# report(id): M, the HTML page, or the Path written; awaited on AsyncClient.
SyncReport = ReportMethod[M, str, Path]
AsyncReport = ReportMethod[
    Coroutine[Any, Any, M], Coroutine[Any, Any, str], Coroutine[Any, Any, Path]
]


def report_endpoint(id_name: str, path: Callable[[str], str], model: type[Any], doc: str) -> Any:
    """The `report(<id_name>, *, format="json", to=None)` method of a resource (typed per
    twin as SyncReport[model] / AsyncReport[model]): `model` for JSON, the HTML page as a
    str, or with `to=` the body streamed into that file and its Path returned."""

    def report(
        self: APIResource,
        *args: str,
        format: Union[Literal["json", "html"], str] = "json",
        to: Optional[PathLike] = None,
        **named: str,
    ) -> Steps[Any]:
        ids = [*args, *(named.pop(k) for k in [id_name] if k in named)]
        if len(ids) != 1 or named:
            raise TypeError(f"report() takes one {id_name} and the keywords format and to")
        opts = report_options(path(ids[0]), format)
        return (yield from self._report(opts, format, model, to))

    keyword = inspect.Parameter.KEYWORD_ONLY
    report.__doc__ = doc
    report.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            inspect.Parameter(id_name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="str"),
            inspect.Parameter("format", keyword, default="json", annotation="ReportFormat"),
            inspect.Parameter("to", keyword, default=None, annotation="Optional[PathLike]"),
        ],
        return_annotation=f"Steps[Union[{model.__name__}, str, Path]]",
    )
    return endpoint(cast(Any, report))


class CompareMethod(Protocol[J_co, Hm_co, Pt_co]):
    """`compare(jobs=...)`: like ReportMethod, with the comparison's own parameters."""

    @overload
    def __call__(
        self,
        *,
        jobs: Any,
        format: Literal["json"] = ...,
        metric: Optional[str] = ...,
        file_id: Optional[str] = ...,
        group_by: Optional[str] = ...,
        to: None = ...,
    ) -> J_co: ...
    @overload
    def __call__(
        self,
        *,
        jobs: Any,
        format: Literal["html"],
        metric: Optional[str] = ...,
        file_id: Optional[str] = ...,
        group_by: Optional[str] = ...,
        to: None = ...,
    ) -> Hm_co: ...
    @overload
    def __call__(
        self,
        *,
        jobs: Any,
        format: Format = ...,
        metric: Optional[str] = ...,
        file_id: Optional[str] = ...,
        group_by: Optional[str] = ...,
        to: PathLike,
    ) -> Pt_co: ...
