"""Base classes of the resource namespaces (`client.files`, `client.jobs`, ...): what both
twins of a resource share (APIResource: the steps of common calls) and how each side pages
(SyncAPIResource, AsyncAPIResource). The methods themselves are written once with the
decorators of _methods."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, Optional, TypeVar, Union
from urllib.parse import quote

from typing_extensions import ParamSpec

from ._base_client import AsyncAPIClient, SyncAPIClient
from ._retries import RequestOptions
from ._steps import Steps
from .pagination import AsyncCursorPage, AsyncPaginator, CursorPage, SyncPaginator

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")
Params = dict[str, Any]
NextParams = Callable[[Any, Params], Optional[Params]]
PathLike = Union[str, "os.PathLike[str]"]
_ACCEPT = {"json": "application/json", "html": "text/html"}


def after_last_id(page: Any, params: Params) -> Params:
    """The API's cursor: the next page starts after the last id (or seq) of this one."""
    params["after"] = page.last_id if page.last_id is not None else page.data[-1].id
    return params


def path_id(value: str, what: str) -> str:
    """An id as a URL path segment (quoted: an id never changes which route is called)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a {what} id, got {value!r}")
    return quote(value, safe="")


def report_options(path: str, format: str, params: Optional[Params] = None) -> RequestOptions:
    """GET a report in `format` ("json" or "html"; the server checks it: 422 on `format`)."""
    if not isinstance(format, str) or not format:
        raise ValueError(f"expected a report format such as 'json' or 'html', got {format!r}")
    return RequestOptions(
        "GET",
        path,
        params={**(params or {}), "format": format},
        headers={"Accept": _ACCEPT.get(format, "*/*")},
    )


# Keywords of a create that are options of the request, not fields of the body.
REQUEST_OPTIONS = ("extra_body", "idempotency_key", "timeout")


def request_body(
    fields: Mapping[str, Any], extra_body: Optional[Mapping[str, Any]]
) -> dict[str, Any]:
    """The JSON body of a create: only what the caller set (the server fills in its
    defaults, the paper's, and the idempotency hash covers exactly this), then `extra_body`
    (fields this SDK version does not know)."""
    body: dict[str, Any] = {}
    for name, value in fields.items():
        if value is not None:
            body[name] = dict(value) if isinstance(value, Mapping) else value
    body.update(extra_body or {})
    return body


@dataclass
class Listing(Generic[T]):
    """What a paged method lists: the path, the item type, the query, the cursor rule."""

    path: str
    item: type[T]
    params: Params = field(default_factory=dict)
    next_params: NextParams = after_last_id


class APIResource:
    """What both twins of a resource share: the client and the steps of common calls."""

    _client: Any

    def __init__(self, client: Any) -> None:
        self._client = client

    def _create_body(self, keywords: Mapping[str, Any]) -> dict[str, Any]:
        """The body of a create from its method's `locals()` (its keywords): every field
        set, then `extra_body`."""
        fields = {k: v for k, v in keywords.items() if k != "self" and k not in REQUEST_OPTIONS}
        return request_body(fields, keywords.get("extra_body"))

    def _call(self, cast_to: type[T], opts: RequestOptions) -> Steps[T]:
        return self._client._call_steps(cast_to, opts)  # type: ignore[no-any-return]

    def _get(self, path: str, cast_to: type[T]) -> Steps[T]:
        return self._call(cast_to, RequestOptions("GET", path))

    def _download(self, opts: RequestOptions, to: Optional[PathLike]) -> Steps[Union[bytes, Path]]:
        return self._client._download_steps(opts, to)  # type: ignore[no-any-return]

    def _report(
        self, opts: RequestOptions, format: str, model: type[Any], to: Optional[PathLike]
    ) -> Steps[Any]:
        """A report: streamed into `to` (via `to.part`) whatever the format; else the typed
        model for JSON, the page (str) for HTML, the bytes for a format this SDK version
        does not know."""
        if to is not None:
            written = yield from self._download(opts, to)
            return Path(written) if isinstance(written, Path) else written
        response = yield from self._client._request_steps(opts)
        if format == "json":
            return self._client._parse(response, model)
        return response.text if format == "html" else response.content


def _page_kwargs(body: dict[str, Any], item: type[Any]) -> dict[str, Any]:
    return {
        "data": [item.model_validate(x) for x in body.get("data", [])],
        "has_more": bool(body.get("has_more", False)),
        "first_id": body.get("first_id"),
        "last_id": body.get("last_id"),
    }


def page_steps(client: Any, listing: Listing[Any], params: Params) -> Steps[dict[str, Any]]:
    response = yield from client._request_steps(RequestOptions("GET", listing.path, params=params))
    return {
        "params": params,
        "next_params": listing.next_params,
        "request_id": response.headers.get("x-request-id"),
        **_page_kwargs(response.json(), listing.item),
    }


class SyncAPIResource(APIResource):
    _client: SyncAPIClient

    def _paginate(self, listing: Listing[T]) -> SyncPaginator[T]:
        def fetch(params: Params) -> CursorPage[T]:
            page = self._client._run(page_steps(self._client, listing, params))
            return CursorPage(fetch=fetch, **page)

        return SyncPaginator(fetch, listing.params)


class AsyncAPIResource(APIResource):
    _client: AsyncAPIClient

    def _paginate(self, listing: Listing[T]) -> AsyncPaginator[T]:
        async def fetch(params: Params) -> AsyncCursorPage[T]:
            page = await self._client._run(page_steps(self._client, listing, params))
            return AsyncCursorPage(fetch=fetch, **page)

        return AsyncPaginator(fetch, listing.params)
