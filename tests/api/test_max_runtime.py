"""A job's wall-clock limit `max_runtime` (issue 14): the operator's default when the spec
sets none, any value up to the operator's cap, 422 naming the field above it."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from models.settings import Settings
from models.tables import Job
from tests.api.conftest import job_body


def _create(client, team, train_file, **overrides):
    return client.post("/v1/jobs", headers=team.headers, json=job_body(train_file, **overrides))


def test_the_default_is_stored_and_a_user_may_lower_it(client, team_a, train_file, settings):
    r = _create(client, team_a, train_file)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["max_runtime"] == settings.MAX_RUNTIME_SECONDS == 86400
    r = _create(client, team_a, train_file, max_runtime=60)
    assert r.status_code == 201 and r.json()["spec"]["max_runtime"] == 60


def test_above_the_cap_is_422_naming_the_field(
    client, team_a, train_file, settings, queue, db_sessions
):
    settings.CAP_MAX_RUNTIME_SECONDS = 3600.0
    settings.MAX_RUNTIME_SECONDS = 600.0
    assert _create(client, team_a, train_file, max_runtime=3600).status_code == 201
    r = _create(client, team_a, train_file, max_runtime=3601)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["field"] == "max_runtime" and "cap of 3600" in err["message"]
    with db_sessions() as s:
        assert s.execute(select(func.count()).select_from(Job)).scalar_one() == 1
    assert len(queue.job_ids) == 1
    for bad in (0, -5, "soon"):
        r = _create(client, team_a, train_file, max_runtime=bad)
        assert r.status_code == 422 and r.json()["error"]["field"] == "max_runtime", r.text


def test_the_default_may_not_exceed_the_cap():
    with pytest.raises(ValueError, match="MAX_RUNTIME_SECONDS"):
        Settings(MAX_RUNTIME_SECONDS=7200, CAP_MAX_RUNTIME_SECONDS=3600)
