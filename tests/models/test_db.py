"""The engine's idle-only pre-ping: a pooled PostgreSQL connection whose backend died while
it sat idle is replaced before a request gets it; a recently used one is handed out as is."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from models import db
from tests.fixtures.db import _admin_engine


def _backend_pid(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT pg_backend_pid()")).scalar_one()


def _terminate(pid: int) -> None:
    admin = _admin_engine()
    try:
        with admin.connect() as conn:
            assert conn.execute(
                text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}
            ).scalar_one()
    finally:
        admin.dispose()


@pytest.mark.parametrize("idle_enough", [True, False])
def test_a_dead_idle_connection_is_pinged_and_replaced(pg_url, monkeypatch, idle_enough):
    # idle_enough: every checkout counts as idle (threshold 0); otherwise none does
    monkeypatch.setattr(db, "PING_AFTER_IDLE_S", 0.0 if idle_enough else 3600.0)
    engine = db.make_engine(pg_url, pool_size=1, max_overflow=0)
    try:
        dead = _backend_pid(engine)  # the pool keeps this one connection
        _terminate(dead)
        if idle_enough:
            assert _backend_pid(engine) != dead  # pinged, found dead, replaced: no error
        else:
            with pytest.raises(OperationalError):  # not pinged: the request would have failed
                _backend_pid(engine)
            assert _backend_pid(engine) != dead  # the pool discards it after the error
    finally:
        engine.dispose()
