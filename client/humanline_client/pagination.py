"""Cursor pagination as lazy iterators.

    for job in client.jobs.list():            # fetches pages as the loop needs them
        ...
    page = client.jobs.list(limit=10).first_page()   # one request
    page.data, page.has_more, page.next_page()

`limit` is the page size sent to the API, not a cap on the items; stop early with `break` or
`itertools.islice`. Nothing is requested until you iterate or ask for a page.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, Callable, Generic, Optional, TypeVar, Union

__all__ = ["AsyncCursorPage", "AsyncPaginator", "CursorPage", "SyncPaginator"]

T = TypeVar("T")
Params = dict[str, Any]
NextParams = Callable[["_PageBase[Any]", Params], Optional[Params]]


class _PageBase(Generic[T]):
    def __init__(
        self,
        *,
        data: list[T],
        has_more: bool,
        first_id: Union[str, int, None] = None,
        last_id: Union[str, int, None] = None,
        params: Params,
        next_params: NextParams,
        request_id: Optional[str] = None,
    ) -> None:
        self.data = data
        self.has_more = has_more
        self.first_id = first_id
        self.last_id = last_id
        self.request_id = request_id
        self._params = params
        self._next_params = next_params

    def __iter__(self) -> Iterator[T]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> T:
        return self.data[index]

    def next_page_params(self) -> Optional[Params]:
        """The query parameters of the next page, or None on the last page."""
        if not self.has_more or not self.data:
            return None
        return self._next_params(self, dict(self._params))

    def has_next_page(self) -> bool:
        return self.next_page_params() is not None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(data=<{len(self.data)} items>, has_more={self.has_more})"


class CursorPage(_PageBase[T]):
    """One page: `data`, `has_more`, `first_id`, `last_id`; `next_page()` fetches the next."""

    def __init__(self, *, fetch: Callable[[Params], CursorPage[T]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._fetch = fetch

    def next_page(self) -> Optional[CursorPage[T]]:
        params = self.next_page_params()
        return None if params is None else self._fetch(params)


class AsyncCursorPage(_PageBase[T]):
    def __init__(
        self, *, fetch: Callable[[Params], Awaitable[AsyncCursorPage[T]]], **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._fetch = fetch

    async def next_page(self) -> Optional[AsyncCursorPage[T]]:
        params = self.next_page_params()
        return None if params is None else await self._fetch(params)


class SyncPaginator(Generic[T]):
    """A lazy listing: iterate for items (pages fetched on demand), `.pages()` for pages,
    `.first_page()` for a single request."""

    def __init__(self, fetch: Callable[[Params], CursorPage[T]], params: Params) -> None:
        self._fetch = fetch
        self._params = params

    def first_page(self) -> CursorPage[T]:
        return self._fetch(dict(self._params))

    def pages(self) -> Iterator[CursorPage[T]]:
        page: Optional[CursorPage[T]] = self.first_page()
        while page is not None:
            yield page
            page = page.next_page()

    def __iter__(self) -> Iterator[T]:
        for page in self.pages():
            yield from page.data

    def to_list(self) -> list[T]:
        """Every item of every page."""
        return list(self)


class AsyncPaginator(Generic[T]):
    """`async for item in paginator`, `await paginator.first_page()`, `paginator.pages()`."""

    def __init__(
        self, fetch: Callable[[Params], Awaitable[AsyncCursorPage[T]]], params: Params
    ) -> None:
        self._fetch = fetch
        self._params = params

    async def first_page(self) -> AsyncCursorPage[T]:
        return await self._fetch(dict(self._params))

    async def pages(self) -> AsyncIterator[AsyncCursorPage[T]]:
        page: Optional[AsyncCursorPage[T]] = await self.first_page()
        while page is not None:
            yield page
            page = await page.next_page()

    async def __aiter__(self) -> AsyncIterator[T]:
        async for page in self.pages():
            for item in page.data:
                yield item

    async def to_list(self) -> list[T]:
        return [item async for item in self]
