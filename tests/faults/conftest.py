"""Fault-injection and concurrency tests: real services (PostgreSQL, Redis, SeaweedFS S3,
Celery worker processes, uvicorn). PostgreSQL only."""

import pytest

from tests.api.conftest import app, client, queue, settings, store, team_a, team_b  # noqa: F401
from tests.security.conftest import live_server  # noqa: F401
from tests.worker.conftest import stack  # noqa: F401


@pytest.fixture
def db_backend() -> str:
    return "postgresql"
