"""The SDK against the real API: one uvicorn server per test session, in a background thread
on a free loopback port, with a temporary SQLite database and a local object store. Each test
gets its own team and key (so listings are isolated).

No worker runs here: jobs stay `queued` unless a test drives them through the state machine
with `driver` (models.jobs: claim, heartbeat, record_metrics, add_checkpoint, finish), exactly
as a worker would. `server.faults` is a test-only ASGI middleware in front of the app that
answers, delays or cuts requests tagged with an `X-Test-Fault` token (see FaultInjector).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from api.main import create_app
from models import jobs as job_states
from models.base import Base
from models.db import make_engine, make_session_factory
from models.settings import Settings
from models.tables import Job
from models.teams import create_api_key, create_team
from storage import open_store
from storage.keys import checkpoint_prefix, job_prefix
from tests.fixtures.live import bound_socket, serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
try:
    import humanline_client  # noqa: F401 - installed (make install: pip install -e ./client)
except ImportError:  # the repo is not pip-installed: use the source tree
    sys.path.insert(0, str(ROOT / "client"))

from humanline_client import Client  # noqa: E402 - may need the client/ path added above

MAX_JOBS_PER_TEAM = 6


def jsonl(rows: list[dict]) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


PREFERENCE = jsonl(
    [
        {"prompt": f"What is {i} + {i}?", "chosen": str(2 * i), "rejected": "no idea"}
        for i in range(8)
    ]
)


# What `Driver.run` exports as a job's final model (an adapter directory, as peft writes it).
MODEL_FILES = {
    "adapter_model.safetensors": b"final-adapter" * 8,
    "adapter_config.json": b'{"base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"}',
    "README.md": b"# model card\n",
}


# --- the fault-injecting middleware ---------------------------------------------------------


class FaultInjector:
    """Test-only ASGI middleware. `plan(*actions)` returns a token; each request carrying
    `X-Test-Fault: <token>` consumes the next action (then requests pass through):

        ("status", code, headers)  answer `code` at once (the app never sees the request)
        ("after", code)            run the app (its work commits), drop its answer, send `code`
        ("sleep", seconds)         wait, then let the request through (client timeouts)
        ("late", seconds)          run the app, then hold its answer back for `seconds`
        ("cut", n)                 pass n body chunks of the answer, then end it cleanly
        ("drop", n)                pass n body chunks, then break the connection
        "pass"                     let it through

    `seen[token]` keeps the headers of every request that carried the token.
    """

    def __init__(self, app: Any, store: PresigningStore) -> None:
        self.app = app
        self.store = store
        self.plans: dict[str, list] = {}
        self.seen: dict[str, list[dict[str, str]]] = defaultdict(list)
        self.lock = threading.Lock()

    def plan(self, *actions: Any) -> str:
        token = uuid.uuid4().hex
        self.plans[token] = list(actions)
        return token

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if scope["path"].startswith(OBJECTS):  # the "object store" a presigned URL points to
            return await self.store.serve(scope, headers, send)
        token = headers.get("x-test-fault")
        if token is None or token not in self.plans:
            return await self.app(scope, receive, send)
        with self.lock:
            self.seen[token].append(headers)
            actions = self.plans[token]
            action = actions.pop(0) if actions else "pass"
        if action == "pass":
            return await self.app(scope, receive, send)
        kind = action[0]
        if kind == "status":
            _, code, extra = action
            await _send_error(send, code, extra)
        elif kind == "after":
            await self.app(scope, receive, _discard)
            await _send_error(send, action[1], {})
        elif kind == "sleep":
            await asyncio.sleep(action[1])
            await self.app(scope, receive, send)
        elif kind == "late":
            held: list = []

            async def hold(message):
                held.append(message)

            await self.app(scope, receive, hold)
            await asyncio.sleep(action[1])
            try:
                for message in held:
                    await send(message)
            except Exception:  # noqa: BLE001, S110 - the client gave up long ago
                pass
        elif kind in ("cut", "drop"):
            await self._cut(scope, receive, send, action[1], drop=kind == "drop")
        else:  # pragma: no cover
            raise AssertionError(f"unknown fault {action!r}")

    async def _cut(self, scope, receive, send, n: int, *, drop: bool) -> None:
        chunks = 0
        done = False

        class Cut(Exception):
            pass

        async def counting(message):
            nonlocal chunks, done
            if done:
                raise Cut
            if message["type"] == "http.response.body" and message.get("body"):
                chunks += 1
                if chunks > n:
                    done = True
                    if drop:
                        raise RuntimeError("test fault: connection dropped")
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    raise Cut
            await send(message)

        try:
            await self.app(scope, receive, counting)
        except Cut:
            pass


OBJECTS = "/__objects/"


class PresigningStore:
    """The local store, except that checkpoints of the jobs in `presign_jobs` get presigned
    URLs (as on S3: the API answers 307) served by the test server under /__objects/ (see
    FaultInjector), which records the headers each object request came with."""

    def __init__(self, inner: Any, base_url: str) -> None:
        self.inner = inner
        self.base_url = base_url
        self.presign_jobs: set[str] = set()
        self.object_requests: list[dict[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def presigned_url(self, key: str, expires: int = 3600) -> str | None:
        if any(f"/{job}/" in key for job in self.presign_jobs):
            return f"{self.base_url}{OBJECTS}{key}?X-Amz-Signature=test"
        return self.inner.presigned_url(key, expires)

    async def serve(self, scope, headers: dict[str, str], send) -> None:
        self.object_requests.append(headers)
        key = scope["path"][len(OBJECTS) :]
        try:
            body, status = self.inner.get_bytes(key), 200
        except FileNotFoundError:
            body, status = b"<Error><Code>NoSuchKey</Code></Error>", 404
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


async def _discard(message) -> None:
    pass


async def _send_error(send, code: int, extra: dict[str, str]) -> None:
    body = json.dumps(
        {"error": {"message": f"injected {code}", "type": "test_fault", "request_id": "fault"}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --- the server -------------------------------------------------------------------------------


@dataclass
class HookQueue:
    """One of the API's queues (jobs, evaluations): records the ids sent, and hands each to
    `handler` when a test sets one."""

    ids: list[str] = field(default_factory=list)
    handler: Callable[[str], None] | None = None

    def enqueue(self, id_: str) -> None:
        self.ids.append(id_)
        if self.handler is not None:
            self.handler(id_)


@dataclass
class Server:
    url: str
    settings: Settings
    sessions: Any
    store: Any
    queue: HookQueue
    faults: FaultInjector

    def new_team(self, name: str | None = None) -> tuple[str, str]:
        with self.sessions() as s:
            team = create_team(s, name or f"team-{uuid.uuid4().hex[:10]}")
            _, secret = create_api_key(s, team.id)
            s.commit()
            return team.id, secret

    def job_count(self, team_id: str) -> int:
        with self.sessions() as s:
            return s.query(Job).filter(Job.team_id == team_id).count()


@contextlib.contextmanager
def serve(root: Path, settings_class: type[Settings] = Settings, **overrides: Any):
    """The real app on a free loopback port, behind the FaultInjector, until the block ends."""
    settings = settings_class(
        **{
            "DATABASE_URL": f"sqlite:///{root / 'humanline.db'}",
            "STORAGE_URL": f"file://{root / 'objects'}",
            "BROKER_URL": "memory://",
            "MAX_UPLOAD_BYTES": 256 * 1024,
            "MAX_JOBS_PER_TEAM": MAX_JOBS_PER_TEAM,
            "SSE_POLL_SECONDS": 0.05,
            "LOG_LEVEL": "WARNING",
            **overrides,
        }
    )
    engine = make_engine(settings.DATABASE_URL)
    Base.metadata.create_all(engine)
    sessions = make_session_factory(engine)
    sock = bound_socket()
    port = sock.getsockname()[1]
    store = PresigningStore(open_store(settings.STORAGE_URL), f"http://127.0.0.1:{port}")
    queue = HookQueue()
    app = create_app(settings, store=store, queue=queue, session_factory=sessions)
    faults = FaultInjector(app, store)
    try:
        with serve_in_thread(faults, sock, log_level="critical", timeout_graceful_shutdown=1):
            yield Server(f"http://127.0.0.1:{port}", settings, sessions, store, queue, faults)
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    with serve(tmp_path_factory.mktemp("humanline-server")) as running:
        yield running


@pytest.fixture
def team(server) -> tuple[str, str]:
    """(team id, API key) of a fresh team."""
    return server.new_team()


@pytest.fixture
def client(server, team):
    with Client(base_url=server.url, api_key=team[1], timeout=10, max_retries=2) as c:
        yield c


@pytest.fixture
def aclient_args(server, team) -> dict[str, Any]:
    """Keyword arguments of an AsyncClient for the test's team."""
    return {"base_url": server.url, "api_key": team[1], "timeout": 10, "max_retries": 2}


@pytest.fixture
def cli(server, team):
    """`cli("jobs", "list", ok=True)`: the `humanline` command (typer's CliRunner) as the
    test's team; asserts exit status 0 unless ok=False."""
    from typer.testing import CliRunner

    from humanline_client.cli import app

    runner = CliRunner()
    env = {"HUMANLINE_BASE_URL": server.url, "HUMANLINE_API_KEY": team[1]}

    def invoke(*args: str, ok: bool = True):
        result = runner.invoke(app, list(args), env=env)
        if ok:
            assert result.exit_code == 0, (result.output, result.exception)
        return result

    return invoke


@pytest.fixture
def train_file(client) -> str:
    return client.files.upload(file=PREFERENCE, filename="prefs.jsonl").id


# --- driving jobs as a worker would -------------------------------------------------------------


class Driver:
    """Moves jobs through the real state machine (models.jobs), as a worker does."""

    worker = "test-worker"

    def __init__(self, server: Server) -> None:
        self.server = server

    def _tx(self, fn: Callable[[Any], Any]) -> Any:
        with self.server.sessions() as s:
            out = fn(s)
            s.commit()
            return out

    def start(self, job_id: str, total_steps: int | None = None) -> None:
        def go(s):
            assert job_states.claim(s, job_id, self.worker, 60) is not None
            job_states.heartbeat(s, job_id, self.worker, 60, total_steps=total_steps)

        self._tx(go)

    def step(self, job_id: str, step: int, **values: float) -> None:
        def go(s):
            job_states.record_metrics(s, job_id, step, values)
            job_states.heartbeat(s, job_id, self.worker, 60, current_step=step)

        self._tx(go)

    def event(self, job_id: str, kind: str, message: str, **data: Any) -> None:
        self._tx(lambda s: job_states.add_event(s, job_id, kind, message, data or None))

    def checkpoint(self, job_id: str, step: int, files: dict[str, bytes]) -> None:
        with self.server.sessions() as s:
            team_id = s.get(Job, job_id).team_id
        prefix = checkpoint_prefix(team_id, job_id, step)
        for name, data in files.items():
            self.server.store.put_bytes(prefix + name, data)
        self._tx(
            lambda s: job_states.add_checkpoint(
                s, job_id, step, prefix, bytes=sum(map(len, files.values())), files=list(files)
            )
        )

    def export_model(self, job_id: str, files: dict[str, bytes]) -> dict[str, Any]:
        """Upload a final model as the worker does (its files, then a `_COMPLETE` marker)
        and return the `final_model` entry of the job's result."""
        with self.server.sessions() as s:
            team_id = s.get(Job, job_id).team_id
        prefix = job_prefix(team_id, job_id) + "final/"
        for name, data in files.items():
            self.server.store.put_bytes(prefix + name, data)
        self.server.store.put_bytes(prefix + "_COMPLETE", b"{}")
        return {"prefix": prefix, "files": list(files)}

    def finish(self, job_id: str, status: str = "succeeded", **result: Any) -> None:
        ok = self._tx(
            lambda s: job_states.finish(s, job_id, self.worker, status, result=result or None)
        )
        assert ok

    def run(self, job_id: str, steps: int = 3, delay: float = 0.0, loss0: float = 0.7) -> None:
        """A whole successful job: start, `steps` steps with metrics, a checkpoint, done."""
        self.start(job_id, total_steps=steps)
        for step in range(1, steps + 1):
            time.sleep(delay)
            self.step(job_id, step, loss=round(loss0 / step, 4), clip_fraction=0.1)
        self.checkpoint(job_id, steps, {"adapter_model.safetensors": b"weights" * 10})
        final_model = self.export_model(job_id, MODEL_FILES)
        self.finish(job_id, final_step=steps, final_model=final_model)

    def in_background(self, fn: Callable[..., None], *args: Any, **kwargs: Any) -> threading.Thread:
        thread = threading.Thread(target=fn, args=args, kwargs=kwargs, daemon=True)
        thread.start()
        return thread


@pytest.fixture
def driver(server) -> Driver:
    return Driver(server)


@pytest.fixture
def auto_worker(server, driver):
    """Every job created while this fixture is active is run to completion in the
    background (a few steps with metrics, a checkpoint), as the embedded worker would."""

    threads: list[threading.Thread] = []

    def handle(job_id: str) -> None:
        threads.append(driver.in_background(driver.run, job_id, 4, 0.05))

    server.queue.handler = handle
    yield driver
    server.queue.handler = None
    for t in threads:
        t.join(timeout=10)
