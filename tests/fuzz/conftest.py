"""The API test fixtures (tests/api/conftest.py), on PostgreSQL only: fuzzing both
backends would double the time for no new coverage of the API code."""

import pytest

from tests.api.conftest import app, client, queue, settings, store, team_a, team_b  # noqa: F401


@pytest.fixture
def db_backend() -> str:
    return "postgresql"
