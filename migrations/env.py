"""Alembic environment: the URL is DATABASE_URL (models.settings) unless given explicitly.

Precedence: a Connection passed in `config.attributes["connection"]` (tests, the CLI), then
`alembic -x url=...`, then the `sqlalchemy.url` set on the Config, then DATABASE_URL.
SQLite gets batch mode (it cannot ALTER most things in place).
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from models import Base
from models.base import UTCDateTime
from models.db import make_engine, normalize_url
from models.settings import get_settings

config = context.config
if config.config_file_name and "connection" not in config.attributes:
    fileConfig(config.config_file_name, disable_existing_loggers=False)
target_metadata = Base.metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url")
    url = url or config.get_main_option("sqlalchemy.url") or get_settings().DATABASE_URL
    return normalize_url(url)


def _render_item(type_: str, obj, autogen_context):
    """Autogenerate writes our UTC type as the plain timestamptz it stores."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _configure(connection: Connection | None = None, url: str | None = None) -> None:
    dialect = connection.dialect.name if connection is not None else url.split(":")[0]
    context.configure(
        connection=connection,
        url=url,
        target_metadata=target_metadata,
        render_as_batch=dialect.startswith("sqlite"),
        compare_type=True,
        render_item=_render_item,
        literal_binds=connection is None,
    )


def run_migrations_offline() -> None:
    _configure(url=_url())
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            _configure(connection)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
