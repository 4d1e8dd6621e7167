"""Base classes of the resource namespaces (`client.files`, `client.jobs`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar
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
