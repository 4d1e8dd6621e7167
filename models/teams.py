"""Teams and API keys. A key is `hl_<random>`; only its sha256 is stored."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from models.base import utcnow
from models.tables import ApiKey, Team

KEY_PREFIX = "hl_"
DISPLAY_CHARS = 10  # "hl_" + 7 characters: enough to tell keys apart, useless to attack


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def create_team(session: Session, name: str) -> Team:
    team = Team(name=name)
    session.add(team)
    session.flush()
    return team


def get_team(session: Session, id_or_name: str) -> Team | None:
    return session.execute(
        select(Team).where((Team.id == id_or_name) | (Team.name == id_or_name))
    ).scalar_one_or_none()


def create_api_key(session: Session, team_id: str, name: str | None = None) -> tuple[ApiKey, str]:
    """Returns (row, secret). The secret is shown once and cannot be recovered."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        team_id=team_id, name=name, prefix=secret[:DISPLAY_CHARS], secret_hash=hash_secret(secret)
    )
    session.add(key)
    session.flush()
    return key, secret


def team_for_key(session: Session, secret: str) -> Team | None:
    """The team owning a live key, or None (unknown, revoked or malformed)."""
    if not secret.startswith(KEY_PREFIX) or len(secret) > 200:
        return None
    # One query (the key's row joined to its team), not the key and then its lazy `team`:
    # this runs on every authenticated request.
    return session.execute(
        select(Team)
        .join(ApiKey, ApiKey.team_id == Team.id)
        .where(ApiKey.secret_hash == hash_secret(secret), ApiKey.revoked_at.is_(None))
    ).scalar_one_or_none()


def revoke_api_key(session: Session, key_id: str) -> bool:
    key = session.get(ApiKey, key_id)
    if key is None or key.revoked_at is not None:
        return False
    key.revoked_at = utcnow()
    session.flush()
    return True
