"""What the API benchmarks share: a real uvicorn server on a database and broker of the run's own.

    free_port()                      a loopback port nobody listens on
    create_database / drop_database  a PostgreSQL database named for the run, on the server of
                                     --pg-admin-url (dropped WITH (FORCE) afterwards)
    prepare_database(url)            migrate, create a team and an API key; returns the key
    empty_redis_db(url)              a Redis client on a database that holds no keys (or exit)
    start_server / stop_server       `uvicorn --factory api.main:server_app` as a subprocess,
                                     up once /healthz answers (every worker, with --workers N)
    server_pids(root, workers)       the processes that serve requests
    upload_training_file(url, key)   a 64-pair preference file through POST /v1/files
    on_postgres(...)                 all of the above for api_load.py and mixed_load.py: a
                                     fresh database and broker, a server, a key and a file;
                                     everything dropped or flushed afterwards

Used by api_load.py, mixed_load.py and upload_throughput.py (run as scripts, so this folder is
on sys.path).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from procfs import children, cmdline

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PG_ADMIN_URL = os.environ.get(
    "HUMANLINE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- databases ----------------------------------------------------------------------------------


def _admin(admin_url: str):
    from sqlalchemy import create_engine

    from models.db import normalize_url

    return create_engine(normalize_url(admin_url), isolation_level="AUTOCOMMIT")


def create_database(admin_url: str) -> str:
    from sqlalchemy import make_url, text

    from models.db import normalize_url

    admin = _admin(admin_url)
    name = f"humanline_bench_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = make_url(normalize_url(admin_url)).set(database=name)
    return url.render_as_string(hide_password=False)


def drop_database(admin_url: str, url: str) -> None:
    from sqlalchemy import make_url, text

    name = make_url(url).database
    admin = _admin(admin_url)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def prepare_database(url: str) -> str:
    """Migrate `url`, create a team and a key; return the key."""
    from api.cli import migrate_database
    from models.db import make_engine, make_session_factory, session_scope
    from models.teams import create_api_key, create_team

    migrate_database(url)
    engine = make_engine(url)
    with session_scope(make_session_factory(engine)) as session:
        team = create_team(session, f"bench-{secrets.token_hex(4)}")
        _, key = create_api_key(session, team.id, "benchmark")
    engine.dispose()
    return key


def empty_redis_db(redis_url: str):
    import redis

    client = redis.Redis.from_url(redis_url)
    size = client.dbsize()
    if size:
        raise SystemExit(
            f"{redis_url} holds {size} keys: pick an unused database with --redis-db "
            "(the benchmark flushes it afterwards)"
        )
    return client


# --- the server ---------------------------------------------------------------------------------


def start_server(env: dict[str, str], port: int, workers: int, log: Path) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "uvicorn", "--factory", "api.main:server_app",
        "--host", "127.0.0.1", "--port", str(port), "--no-access-log",
        "--workers", str(workers), "--log-level", "warning",
    ]  # fmt: skip
    out = open(log, "wb")  # noqa: SIM115 - the server's log, closed with the process
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    else:
        proc.kill()
        raise SystemExit(f"server did not start:\n{log.read_text()[-3000:]}")
    if workers > 1:  # every worker must be up (each answers /healthz on its own)
        while time.monotonic() < deadline and len(server_pids(proc.pid, workers)) < workers:
            time.sleep(0.2)
    return proc


def stop_server(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def server_pids(root: int, workers: int) -> list[int]:
    """The processes that serve requests: the root itself, or its worker children."""
    if workers == 1:
        return [root]
    # the workers are multiprocessing children; the supervisor may also start a resource tracker
    return [p for p in children(root) if "spawn_main" in cmdline(p) or "uvicorn" in cmdline(p)]


def upload_training_file(base_url: str, key: str) -> str:
    rows = [
        {"prompt": f"What is {i} + {i}?", "chosen": str(2 * i), "rejected": str(2 * i + 1)}
        for i in range(64)
    ]
    content = "".join(json.dumps(r) + "\n" for r in rows).encode()
    response = httpx.post(
        f"{base_url}/v1/files",
        headers={"Authorization": f"Bearer {key}"},
        files={"file": ("prefs.jsonl", content, "application/jsonl")},
        data={"purpose": "train"},
        timeout=30,
    )
    response.raise_for_status()
    return response.json()["id"]


# --- one run on PostgreSQL and Redis ------------------------------------------------------------


def add_service_options(parser, redis_db: int) -> None:
    """--workers, --pg-admin-url, --redis-url and --redis-db (`redis_db` its default)."""
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument(
        "--pg-admin-url",
        default=DEFAULT_PG_ADMIN_URL,
        help="a PostgreSQL database to connect to while creating/dropping the benchmark's own",
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    parser.add_argument("--redis-db", type=int, default=redis_db, help="an unused Redis database")


@dataclass
class Served:
    """A server on a database and broker of its own, with a team's key and a training file."""

    proc: subprocess.Popen
    port: int
    key: str
    file_id: str
    db_url: str
    broker: object  # the redis client of the broker's database
    log: Path
    log_text: str = ""  # the server's log, read once it has stopped

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def on_postgres(args, prefix: str, env: dict[str, str]) -> Iterator[Served]:
    """Start a server on a fresh PostgreSQL database (args.pg_admin_url's server) and Redis
    database (args.redis_url, args.redis_db: checked empty), with `env` on top of the service's
    settings; upload a training file. Afterwards the server is stopped, its log kept in
    `log_text`, the broker flushed, the database dropped and the temporary folder removed."""
    broker_url = f"{args.redis_url.rstrip('/')}/{args.redis_db}"
    redis_client = empty_redis_db(broker_url)
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    db_url = create_database(args.pg_admin_url)
    proc = served = None
    try:
        key = prepare_database(db_url)
        full_env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "STORAGE_URL": f"file://{tmp / 'objects'}",
            "BROKER_URL": broker_url,
            "PYTHONPATH": str(REPO),
            **env,
        }
        port = free_port()
        proc = start_server(full_env, port, args.workers, tmp / "server.log")
        file_id = upload_training_file(f"http://127.0.0.1:{port}", key)
        served = Served(proc, port, key, file_id, db_url, redis_client, tmp / "server.log")
        yield served
    finally:
        stop_server(proc)
        redis_client.flushdb()
        drop_database(args.pg_admin_url, db_url)
        log = tmp / "server.log"
        if served is not None and log.exists():
            served.log_text = log.read_text()
        for p in sorted(tmp.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        tmp.rmdir()
