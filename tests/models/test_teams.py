"""API keys are stored hashed and map back to their team."""

from __future__ import annotations

import hashlib

from sqlalchemy import select

from models.tables import ApiKey
from models.teams import create_api_key, create_team, get_team, revoke_api_key, team_for_key


def test_keys_are_hashed_and_resolve_to_their_team(db_session):
    team = create_team(db_session, "acme")
    _, secret = create_api_key(db_session, team.id, "ci")
    db_session.commit()
    assert secret.startswith("hl_") and len(secret) > 40
    row = db_session.execute(select(ApiKey)).scalar_one()
    assert row.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in (row.prefix, row.secret_hash, row.name) and secret.startswith(row.prefix)
    assert team_for_key(db_session, secret).id == team.id
    assert team_for_key(db_session, secret + "x") is None
    assert team_for_key(db_session, "sk-" + secret[3:]) is None
    assert get_team(db_session, "acme").id == get_team(db_session, team.id).id == team.id


def test_revoked_keys_stop_working(db_session):
    team = create_team(db_session, "acme")
    key, secret = create_api_key(db_session, team.id)
    assert revoke_api_key(db_session, key.id) is True
    assert revoke_api_key(db_session, key.id) is False
    db_session.commit()
    assert team_for_key(db_session, secret) is None
