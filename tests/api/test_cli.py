"""`humanline-server` admin commands, the embedded-worker hook and the job queues."""

from __future__ import annotations

import sys
import threading
import types

import pytest
from typer.testing import CliRunner

from api import deps
from api.cli import app, start_embedded_worker
from models.db import make_session_factory
from models.settings import Settings, get_settings
from models.teams import team_for_key


@pytest.fixture
def env_db(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("DATABASE_URL", url)
    get_settings.cache_clear()
    yield url
    get_settings.cache_clear()


def test_migrate_create_team_and_key(env_db):
    runner = CliRunner()
    assert runner.invoke(app, ["migrate"]).exit_code == 0
    assert runner.invoke(app, ["migrate"]).exit_code == 0  # idempotent
    made = runner.invoke(app, ["create-team", "acme"])
    assert made.exit_code == 0 and made.stdout.strip().startswith("team-")
    dup = runner.invoke(app, ["create-team", "acme"])
    assert dup.exit_code != 0 and "already exists" in str(dup.output) + str(dup.exception)
    key = runner.invoke(app, ["create-key", "acme", "--name", "ci"])
    assert key.exit_code == 0
    secret = key.stdout.strip()
    assert secret.startswith("hl_")
    with make_session_factory(env_db)() as s:
        assert team_for_key(s, secret).name == "acme"
    missing = runner.invoke(app, ["create-key", "nobody"])
    assert missing.exit_code != 0


def test_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@db/h")
    monkeypatch.setenv("BROKER_URL", "redis://r:6379/0")
    monkeypatch.setenv("MAX_UPLOAD_BYTES", "1000")
    monkeypatch.setenv("ALLOWED_BASE_MODELS", "a, b ,")
    settings = Settings()
    assert settings.DATABASE_URL == "postgresql://u@db/h" and not settings.embedded_worker
    assert settings.MAX_UPLOAD_BYTES == 1000 and settings.allowed_base_models == ("a", "b")
    defaults = Settings(_env_file=None, BROKER_URL="memory://")
    assert defaults.embedded_worker
    s3 = Settings(
        S3_ENDPOINT_URL="http://s3:9000", AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s"
    )
    assert s3.storage_options() == {
        "endpoint_url": "http://s3:9000",
        "aws_access_key_id": "k",
        "aws_secret_access_key": "s",
    }
    assert "AWS_SECRET_ACCESS_KEY" not in repr(s3)  # never printed with the settings


def test_embedded_worker_hook(monkeypatch):
    assert start_embedded_worker(Settings(BROKER_URL="redis://x")) is None
    started = []
    fake = types.ModuleType("worker.embedded")
    fake.start = lambda settings: started.append(settings) or "handle"
    monkeypatch.setitem(sys.modules, "worker.embedded", fake)
    settings = Settings(BROKER_URL="memory://")
    assert start_embedded_worker(settings) == "handle" and started == [settings]


def test_embedded_worker_hook_explains_a_missing_worker(monkeypatch):
    monkeypatch.setitem(sys.modules, "worker.embedded", None)  # import fails
    with pytest.raises(SystemExit, match="worker.embedded"):
        start_embedded_worker(Settings(BROKER_URL="memory://"))
    with pytest.raises(RuntimeError, match="worker.embedded"):
        deps.EmbeddedQueue().enqueue("job-1")


def test_embedded_queue_hands_jobs_to_the_worker(monkeypatch):
    got = []
    fake = types.ModuleType("worker.embedded")
    fake.enqueue = got.append
    monkeypatch.setitem(sys.modules, "worker.embedded", fake)
    deps.EmbeddedQueue().enqueue("job-1")
    assert got == ["job-1"]


def test_default_queue_follows_the_broker_url():
    assert isinstance(deps.default_queue(Settings(BROKER_URL="memory://")), deps.EmbeddedQueue)
    queue = deps.default_queue(Settings(BROKER_URL="redis://h:6379/0", CELERY_QUEUE="gpu-a100"))
    assert isinstance(queue, deps.BackgroundQueue) and isinstance(queue, deps.JobQueue)
    assert isinstance(queue.inner, deps.CeleryQueue) and queue.inner.queue == "gpu-a100"


def test_background_queue_sends_in_order_and_survives_broker_errors(caplog):
    sent, done = [], threading.Event()

    class Flaky:
        def enqueue(self, job_id):
            if job_id == "job-2":
                raise ConnectionError("broker down")
            sent.append(job_id)
            if job_id == "job-4":
                done.set()

    queue = deps.BackgroundQueue(Flaky())
    for i in range(1, 5):
        queue.enqueue(f"job-{i}")  # returns at once: the sender thread talks to the broker
    assert done.wait(10)
    assert sent == ["job-1", "job-3", "job-4"]  # job-2 stays queued in the DB for the sweep
    assert any("could not enqueue" in r.getMessage() for r in caplog.records)


def test_celery_queue_sends_run_job_by_name(monkeypatch):
    sent = []

    class FakeCelery:
        def send_task(self, name, args, **options):
            sent.append((name, args, options))

    queue = deps.CeleryQueue("redis://h:6379/0", "gpu")
    monkeypatch.setattr(queue, "_app", lambda: FakeCelery())
    queue.enqueue("job-7")
    assert sent == [("worker.tasks.run_job", ["job-7"], {"queue": "gpu"})]


def test_celery_queue_reaches_a_real_redis_broker():
    redis = pytest.importorskip("redis")
    client = redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=1)
    try:
        client.ping()
    except Exception:  # noqa: BLE001
        pytest.skip("no Redis on 127.0.0.1:6379")
    name = "humanline-test-queue"
    client.delete(name)
    try:
        deps.CeleryQueue("redis://127.0.0.1:6379/0", name).enqueue("job-redis")
        assert client.llen(name) == 1
        assert b"worker.tasks.run_job" in client.lindex(name, 0)
    finally:
        client.delete(name)


def test_serve_with_several_workers_needs_a_broker(env_db, monkeypatch):
    monkeypatch.setenv("BROKER_URL", "memory://")
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["serve", "--workers", "2", "--no-migrate"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code != 0
    assert "needs a broker" in str(result.exception) + result.output
