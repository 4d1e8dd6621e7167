"""Declarative base, column types and id generation shared by every table."""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, MetaData
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

# Deterministic constraint names: Alembic needs them to alter/drop constraints, and SQLite's
# batch mode rebuilds tables by name.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# JSONB on PostgreSQL (indexable, `->>` in filters), JSON text elsewhere.
JSONType = JSON().with_variant(postgresql.JSONB(), "postgresql")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on every backend.

    PostgreSQL stores timestamptz; SQLite has no timezone, so values are stored as naive UTC
    and given their timezone back when read. Comparisons in SQL (lease expiry) therefore mean
    the same thing on both.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads it from the class
        datetime: UTCDateTime(),
        dict[str, Any]: JSONType,
        list[str]: JSONType,
    }


def new_id(prefix: str) -> str:
    """`{prefix}-` + 12 hex digits of milliseconds + 16 random hex digits.

    Ids sort by creation time, so cursor pagination is `WHERE id < :after ORDER BY id DESC`
    with no extra column; the random half keeps them unguessable and collision-free.
    """
    return f"{prefix}-{int(time.time() * 1000):012x}{secrets.token_hex(8)}"
