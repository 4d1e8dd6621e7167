"""Base classes of the resource namespaces (`client.files`, `client.jobs`, ...)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, Union
from urllib.parse import quote

from ._base_client import RequestOptions
from .pagination import AsyncCursorPage, AsyncPaginator, CursorPage, SyncPaginator

if TYPE_CHECKING:
    from ._client import AsyncClient, Client

T = TypeVar("T")
Params = dict[str, Any]
NextParams = Callable[[Any, Params], Optional[Params]]


def after_last_id(page: Any, params: Params) -> Params:
    """The API's cursor: the next page starts after the last id (or seq) of this one."""
    params["after"] = page.last_id if page.last_id is not None else page.data[-1].id
    return params


def _page_kwargs(body: dict[str, Any], item: type[Any]) -> dict[str, Any]:
    return {
        "data": [item.model_validate(x) for x in body.get("data", [])],
        "has_more": bool(body.get("has_more", False)),
        "first_id": body.get("first_id"),
        "last_id": body.get("last_id"),
    }


def path_id(value: str, what: str) -> str:
    """An id as a URL path segment (quoted: an id never changes which route is called)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a {what} id, got {value!r}")
    return quote(value, safe="")


PathLike = Union[str, "os.PathLike[str]"]
_ACCEPT = {"json": "application/json", "html": "text/html"}


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


def report_result(client: Any, response: Any, format: str, model: type[Any]) -> Any:
    """A report answered in memory: the typed model for JSON, the page (str) for HTML, the
    bytes for a format this SDK version does not know."""
    if format == "json":
        return client._parse(response, model)
    if format == "html":
        return response.text
    return response.content


class SyncAPIResource:
    def __init__(self, client: Client) -> None:
        self._client = client

    def _paginate(
        self, path: str, item: type[T], params: Params, next_params: NextParams = after_last_id
    ) -> SyncPaginator[T]:
        def fetch(page_params: Params) -> CursorPage[T]:
            response = self._client.request(RequestOptions("GET", path, params=page_params))
            return CursorPage(
                fetch=fetch,
                params=page_params,
                next_params=next_params,
                request_id=response.headers.get("x-request-id"),
                **_page_kwargs(response.json(), item),
            )

        return SyncPaginator(fetch, params)

    def _report(
        self, opts: RequestOptions, format: str, model: type[Any], to: Optional[PathLike]
    ) -> Any:
        if to is not None:  # streamed into the file (via `to.part`), whatever the format
            return Path(self._client._download(opts, to))
        return report_result(self._client, self._client.request(opts), format, model)


class AsyncAPIResource:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    def _paginate(
        self, path: str, item: type[T], params: Params, next_params: NextParams = after_last_id
    ) -> AsyncPaginator[T]:
        async def fetch(page_params: Params) -> AsyncCursorPage[T]:
            response = await self._client.request(RequestOptions("GET", path, params=page_params))
            return AsyncCursorPage(
                fetch=fetch,
                params=page_params,
                next_params=next_params,
                request_id=response.headers.get("x-request-id"),
                **_page_kwargs(response.json(), item),
            )

        return AsyncPaginator(fetch, params)

    async def _report(
        self, opts: RequestOptions, format: str, model: type[Any], to: Optional[PathLike]
    ) -> Any:
        if to is not None:
            return Path(await self._client._download(opts, to))
        return report_result(self._client, await self._client.request(opts), format, model)
