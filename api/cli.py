"""`humanline-server`: the service's admin and serve commands (the SDK's CLI is `humanline`).

humanline-server migrate                 # alembic upgrade head on DATABASE_URL
humanline-server create-team acme        # prints the team id
humanline-server create-key acme         # prints a new API key, once (its id on stderr)
humanline-server keys list acme          # id, prefix, name, created, revoked of each key
humanline-server keys revoke key-...     # the key stops working (within AUTH_CACHE_SECONDS)
humanline-server serve                   # API (+ embedded worker when BROKER_URL=memory://)
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated, Any

import typer

from models.settings import Settings, get_settings

app = typer.Typer(
    help="Humanline service: database, teams, API keys and the HTTP server.",
    no_args_is_help=True,
    add_completion=False,
)

MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations"


def migrate_database(url: str) -> None:
    """`alembic upgrade head` on `url` (the same as running alembic in the repo root)."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    command.upgrade(config, "head")


def start_embedded_worker(settings: Settings) -> Any:
    """The hook for BROKER_URL=memory://: run jobs inside this process.

    Calls `worker.embedded.start(settings)`, which must start the worker in the background
    (it receives job ids from api.queues.EmbeddedQueue via `worker.embedded.enqueue(job_id)`)
    and return a handle with `stop()`. Returns None with a real broker: Celery workers run
    elsewhere (`celery -A worker.tasks worker`)."""
    if not settings.embedded_worker:
        return None
    try:
        embedded = importlib.import_module("worker.embedded")
    except ImportError as exc:
        raise SystemExit(
            f"BROKER_URL=memory:// runs jobs in this process but worker.embedded cannot be "
            f"imported ({exc}); install the worker extra, or set BROKER_URL to a broker"
        ) from exc
    return embedded.start(settings)


@app.command()
def migrate() -> None:
    """Create or upgrade every table (alembic upgrade head) on DATABASE_URL."""
    settings = get_settings()
    migrate_database(settings.DATABASE_URL)
    typer.echo("database is at the latest migration")


@app.command("create-team")
def create_team(name: Annotated[str, typer.Argument(help="A unique team name.")]) -> None:
    """Create a team and print its id."""
    from sqlalchemy.exc import IntegrityError

    from models.db import make_session_factory, session_scope
    from models.teams import create_team as _create

    factory = make_session_factory(get_settings().DATABASE_URL)
    try:
        with session_scope(factory) as session:
            team = _create(session, name)
            team_id = team.id
    except IntegrityError:
        raise SystemExit(f"a team named {name!r} already exists") from None
    typer.echo(team_id)


@app.command("create-key")
def create_key(
    team: Annotated[str, typer.Argument(help="Team id or name.")],
    name: Annotated[str | None, typer.Option(help="A label for the key.")] = None,
) -> None:
    """Create an API key for a team and print it. It is shown once: only its hash is kept."""
    from models.db import make_session_factory, session_scope
    from models.teams import create_api_key, get_team

    factory = make_session_factory(get_settings().DATABASE_URL)
    with session_scope(factory) as session:
        row = get_team(session, team)
        if row is None:
            raise SystemExit(f"no team {team!r}; create it with `humanline-server create-team`")
        key, secret = create_api_key(session, row.id, name)
        key_id = key.id
    typer.echo(f"key id: {key_id} (revoke with `humanline-server keys revoke {key_id}`)", err=True)
    typer.echo(secret)  # alone on stdout: KEY=$(humanline-server create-key acme)


keys = typer.Typer(help="List and revoke a team's API keys.", no_args_is_help=True)
app.add_typer(keys, name="keys")


@keys.command("list")
def list_keys(team: Annotated[str, typer.Argument(help="Team id or name.")]) -> None:
    """One line per key, oldest first: id, prefix, name, created, revoked (never the secret)."""
    from sqlalchemy import select

    from models.db import make_session_factory, session_scope
    from models.tables import ApiKey
    from models.teams import get_team

    factory = make_session_factory(get_settings().DATABASE_URL)
    with session_scope(factory) as session:
        row = get_team(session, team)
        if row is None:
            raise SystemExit(f"no team {team!r}")
        rows = session.execute(
            select(ApiKey).where(ApiKey.team_id == row.id).order_by(ApiKey.created_at, ApiKey.id)
        ).scalars().all()
        lines = [
            "\t".join((k.id, k.prefix + "...", k.name or "-", k.created_at.isoformat(),
                       f"revoked {k.revoked_at.isoformat()}" if k.revoked_at else "active"))
            for k in rows
        ]
    typer.echo("\n".join(["id\tprefix\tname\tcreated\tstatus", *lines]))


@keys.command("revoke")
def revoke_key(key_id: Annotated[str, typer.Argument(help="A key id from `keys list`.")]) -> None:
    """Revoke a key: refused from then on (each API process may trust it for up to
    AUTH_CACHE_SECONDS more). Revoking an unknown or already revoked key is an error."""
    from models.db import make_session_factory, session_scope
    from models.teams import revoke_api_key

    settings = get_settings()
    factory = make_session_factory(settings.DATABASE_URL)
    with session_scope(factory) as session:
        done = revoke_api_key(session, key_id)
    if not done:
        raise SystemExit(f"no active key {key_id!r}")
    typer.echo(f"revoked {key_id}; API processes stop accepting it within "
               f"{settings.AUTH_CACHE_SECONDS:g} s")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Default: HOST.")] = None,
    port: Annotated[int | None, typer.Option(help="Default: PORT.")] = None,
    migrate_first: Annotated[
        bool, typer.Option("--migrate/--no-migrate", help="Upgrade the schema before serving.")
    ] = True,
    workers: Annotated[
        int, typer.Option(min=1, help="API processes (one per core); 1 with BROKER_URL=memory://.")
    ] = 1,
) -> None:
    """Serve the API; with BROKER_URL=memory:// also run jobs in this process."""
    import uvicorn

    from api.main import create_app, serve_metrics, tune_serving_process

    settings = get_settings()
    if migrate_first:
        migrate_database(settings.DATABASE_URL)
    if workers > 1:
        if settings.embedded_worker:
            raise SystemExit(
                "--workers > 1 needs a broker: the embedded worker runs in one process"
            )
        if settings.METRICS_PORT:
            raise SystemExit(
                "METRICS_PORT serves one process's metrics: with --workers > 1 the processes "
                "would share it; run one process per container (replicas) instead"
            )
        uvicorn.run(
            "api.main:server_app", factory=True, workers=workers, access_log=False,
            host=host or settings.HOST, port=port or settings.PORT, proxy_headers=False,
        )
        return
    application = create_app(settings)
    serve_metrics(application)
    tune_serving_process()
    worker = start_embedded_worker(settings)
    try:
        uvicorn.run(
            application, host=host or settings.HOST, port=port or settings.PORT, access_log=False,
            # uvicorn trusts loopback's X-Forwarded-For by default: TRUSTED_PROXIES decides
            proxy_headers=False,
        )  # the app writes its own JSON access log
    finally:
        if worker is not None and hasattr(worker, "stop"):
            worker.stop()


if __name__ == "__main__":  # pragma: no cover
    app()
