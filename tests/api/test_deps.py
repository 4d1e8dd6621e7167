"""api/deps.py under concurrency: request sessions never deadlock the thread pool against the
connection pool."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
import httpx
import pytest

from api.main import create_app
from models.db import make_engine, make_session_factory

REPO = Path(__file__).resolve().parents[2]


def test_a_burst_larger_than_the_pools_is_served_without_deadlock(
    db_url, settings, store, queue, team_a
):
    """One pooled connection, four worker threads, twenty concurrent requests. Without the
    request-session limit, the requests blocked in the pool's checkout hold every worker
    thread while the one owning the connection waits for a thread: nothing moves until the
    pool timeout turns the burst into 500s."""
    engine = make_engine(db_url, pool_size=1, max_overflow=0, pool_timeout=5)
    factory = make_session_factory(engine)
    app = create_app(settings, store=store, queue=queue, session_factory=factory)

    async def burst() -> list[int]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = 4
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            responses = await asyncio.gather(
                *(client.get("/v1/jobs", headers=team_a.headers) for _ in range(20))
            )
        return [r.status_code for r in responses]

    try:
        assert asyncio.run(asyncio.wait_for(burst(), 60)) == [200] * 20
    finally:
        engine.dispose()


def test_autocommit_reads_open_no_transaction_and_leave_the_pool_as_it_was(db_url):
    if not db_url.startswith("postgresql"):
        pytest.skip("psycopg's transaction status is what is checked")
    from sqlalchemy import text

    from api.deps import autocommit_reads

    engine = make_engine(db_url, pool_size=1, max_overflow=0)  # the same connection twice
    factory = make_session_factory(engine)
    try:
        with factory() as session:
            autocommit_reads(session)
            session.execute(text("SELECT 1"))
            driver = session.connection().connection.driver_connection
            assert driver.info.transaction_status == 0  # idle: no BEGIN was sent
            session.commit()
        with factory() as session:
            session.execute(text("SELECT 1"))
            driver = session.connection().connection.driver_connection
            assert driver.info.transaction_status == 2  # a normal request is transactional
    finally:
        engine.dispose()
