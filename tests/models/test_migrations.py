"""The migrations build exactly the tables the ORM declares, on SQLite and PostgreSQL."""

from __future__ import annotations

import secrets

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from api.cli import MIGRATIONS, migrate_database
from models.base import Base
from models.db import make_engine
from tests.fixtures.db import PG_ADMIN_URL, _admin_engine


def _diff(engine) -> list:
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "render_as_batch": True}
        )
        return compare_metadata(context, Base.metadata)


def _config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url)
    return config


def test_sqlite_migrations_match_models(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    migrate_database(url)
    engine = make_engine(url)
    try:
        assert _diff(engine) == []
        tables = set(inspect(engine).get_table_names())
        assert set(Base.metadata.tables) <= tables
    finally:
        engine.dispose()


def test_sqlite_downgrade_and_upgrade_again(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    command.upgrade(_config(url), "head")
    command.downgrade(_config(url), "base")
    engine = make_engine(url)
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}
    engine.dispose()
    command.upgrade(_config(url), "head")
    engine = make_engine(url)
    try:
        assert _diff(engine) == []  # the schema came back whole
    finally:
        engine.dispose()


def test_postgresql_migrations_match_models(pg_url):
    # pg_url was built by `alembic upgrade head` (tests/fixtures/db.py)
    engine = make_engine(pg_url)
    try:
        assert _diff(engine) == []
    finally:
        engine.dispose()


def test_postgresql_downgrade_and_upgrade_again(pg_url):
    admin = _admin_engine()
    name = f"humanline_mig_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        command.upgrade(_config(url), "head")
        command.downgrade(_config(url), "base")
        command.upgrade(_config(url), "head")
        engine = make_engine(url)
        assert _diff(engine) == []
        engine.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_every_table_is_in_the_initial_migration(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    command.upgrade(_config(url), "0001")
    engine = make_engine(url)
    try:
        later = {"webhook_endpoints", "webhook_deliveries", "webhook_attempts"}  # 0007
        assert set(Base.metadata.tables) - later <= set(inspect(engine).get_table_names())
        assert not later & set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
