"""Cursor paging, once: every list route takes `after` and `limit` (Cursor, Limit), fetches
`limit + 1` rows and builds its Page here; `where_given` applies the filters a caller gave."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Protocol, TypeVar

from fastapi import Query
from sqlalchemy import Select
from sqlalchemy.orm import Session

from api.schemas import Page


class _Out(Protocol):
    @classmethod
    def of(cls, row: Any) -> Any: ...


T = TypeVar("T", bound=_Out)

# `after`: the last id of the previous page; `limit`: the page's size
Cursor = Annotated[
    str | None, Query(max_length=64, description="Cursor: the last id of the previous page.")
]
Limit = Annotated[int, Query(ge=1, le=100)]
DEFAULT_LIMIT = 20  # a list's page size when `limit` is not given


def where_given(query: Select, *filters: tuple[Any, Any]) -> Select:
    """`query` narrowed to column == value for each (column, value) whose value was given."""
    for column, value in filters:
        if value is not None:
            query = query.where(column == value)
    return query


def newest_first(query: Select, id_column: Any, after: str | None, limit: int) -> Select:
    """A page of `query` newest first (ids grow with time), after the cursor `after`."""
    if after is not None:
        query = query.where(id_column < after)
    return query.order_by(id_column.desc()).limit(limit + 1)


def page_of(rows: Sequence[Any], limit: int, model: type[T], key: str = "id") -> Page[T]:
    """The Page of `model.of(row)` for `rows` fetched with limit + 1 (one more: has_more);
    `key` is the item's cursor attribute (first_id, last_id)."""
    data = [model.of(r) for r in rows[:limit]]
    return Page[model](  # type: ignore[valid-type]
        data=data,
        has_more=len(rows) > limit,
        first_id=getattr(data[0], key) if data else None,
        last_id=getattr(data[-1], key) if data else None,
    )


def fetch_page(
    session: Session, query: Select, id_column: Any, after: str | None, limit: int, model: type[T]
) -> Page[T]:
    """newest_first + page_of, for a query of ORM rows."""
    rows = list(session.execute(newest_first(query, id_column, after, limit)).scalars())
    return page_of(rows, limit, model)
