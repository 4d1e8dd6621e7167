"""Engines and sessions from a URL.

SQLite (the embedded default) gets WAL, enforced foreign keys and a busy timeout so the API
threads and the in-process worker can share one file; PostgreSQL gets pool_pre_ping so a
restarted database does not surface as errors, checked only on connections idle for a
while (a ping per checkout would be one more round trip on every request under load).
JSON columns are written by `json_text` on both backends and decoded by orjson on PostgreSQL
(3-5x faster than json.loads on the job specs that every job listing reads).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, create_engine, event, exc, make_url
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_MS = 30_000
PING_AFTER_IDLE_S = 1.0  # a connection idle this long is pinged before it is handed out


def normalize_url(url: str) -> str:
    """postgres:// and postgresql:// mean psycopg 3 (the only PostgreSQL driver we ship)."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


class UnstorableValue(exc.DontWrapMixin, ValueError):
    """A value no JSON column holds: text that is not Unicode (a lone surrogate, from a
    `\\ud800` escape; PostgreSQL refuses it too) or an integer beyond 64 bits. Raised as it
    is on both backends (not wrapped in StatementError): the API answers it with a 422."""


_UNSTORABLE = ("surrogates not allowed", "exceeds 64-bit range")


def json_text(value: Any) -> str:
    """A JSON column's text, the same on both backends (orjson). A non-finite float (a loss
    that diverged) is stored as null: JSON has no NaN, PostgreSQL's jsonb refuses one, and
    SQLite would keep text that no strict reader (our API's responses) accepts."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError as error:
        if any(reason in str(error) for reason in _UNSTORABLE):
            raise UnstorableValue(str(error)) from None
        raise


def make_engine(url: str, **kwargs) -> Engine:
    kwargs.setdefault("json_serializer", json_text)
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if database and database != ":memory:" and not database.startswith("file:"):
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        connect_args = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
        engine = create_engine(url, connect_args=connect_args, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    kwargs.setdefault("json_deserializer", orjson.loads)
    engine = create_engine(url, **kwargs)
    if not kwargs.get("pool_pre_ping"):
        event.listen(engine, "checkin", _note_checkin)
        event.listen(engine, "checkout", _ping_if_idle)
    return engine


def _note_checkin(_dbapi_connection, record) -> None:
    record.info["checked_in"] = time.monotonic()


def _ping_if_idle(dbapi_connection, record, _proxy) -> None:
    """pool_pre_ping for connections idle longer than PING_AFTER_IDLE_S only. A dead one
    raises DisconnectionError, on which the pool discards it and checks out another (a
    connection that dies while busy fails its statement either way, pinged or not)."""
    if time.monotonic() - record.info.get("checked_in", time.monotonic()) < PING_AFTER_IDLE_S:
        return
    try:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        dbapi_connection.rollback()
    except Exception as error:  # noqa: BLE001 - any failure means: not usable
        raise exc.DisconnectionError(str(error)) from error


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_session_factory(engine_or_url: Engine | str) -> sessionmaker[Session]:
    """Sessions that keep loaded attributes after commit (responses are built after it)."""
    engine = make_engine(engine_or_url) if isinstance(engine_or_url, str) else engine_or_url
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on any exception."""
    with factory() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
