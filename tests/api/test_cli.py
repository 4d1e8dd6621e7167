"""`humanline-server` admin commands and the embedded-worker hook (the queues: test_queues)."""

from __future__ import annotations

import sys
import types

import pytest
from typer.testing import CliRunner

from api import queues
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


def test_keys_are_listed_by_id_and_revoked(env_db):
    """Issue 14 #10: create-key prints the key's id; `keys list` shows ids, never secrets;
    `keys revoke` stops the key."""
    runner = CliRunner()
    runner.invoke(app, ["migrate"])
    runner.invoke(app, ["create-team", "acme"])
    made = [runner.invoke(app, ["create-key", "acme", "--name", f"k{i}"]) for i in range(2)]
    secrets = [m.stdout.strip() for m in made]
    ids = [m.stderr.split("key id: ")[1].split()[0] for m in made]
    assert all(i.startswith("key-") for i in ids) and len(set(ids)) == 2
    listed = runner.invoke(app, ["keys", "list", "acme"])
    assert listed.exit_code == 0
    lines = listed.stdout.strip().splitlines()[1:]
    assert [line.split("\t")[0] for line in lines] == ids
    assert [line.split("\t")[2] for line in lines] == ["k0", "k1"]
    assert all(line.endswith("active") for line in lines)
    assert not any(s in listed.stdout for s in secrets)
    assert secrets[0][:10] + "..." in lines[0]
    revoked = runner.invoke(app, ["keys", "revoke", ids[0]])
    assert revoked.exit_code == 0, revoked.output
    with make_session_factory(env_db)() as s:
        assert team_for_key(s, secrets[0]) is None
        assert team_for_key(s, secrets[1]).name == "acme"
    lines = runner.invoke(app, ["keys", "list", "acme"]).stdout.strip().splitlines()[1:]
    assert "revoked" in lines[0] and lines[1].endswith("active")
    assert runner.invoke(app, ["keys", "revoke", ids[0]]).exit_code != 0  # already revoked
    assert runner.invoke(app, ["keys", "revoke", "key-nope"]).exit_code != 0
    assert runner.invoke(app, ["keys", "list", "nobody"]).exit_code != 0


def test_serve_leaves_forwarded_headers_to_trusted_proxies(env_db, monkeypatch):
    """Issue 14 #6: uvicorn trusts X-Forwarded-For from loopback by default, so a rotating
    header from 127.0.0.1 bypassed the failed-login limiter; the app decides (TRUSTED_PROXIES)."""
    import uvicorn

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: calls.append(kw))
    monkeypatch.setenv("BROKER_URL", "redis://127.0.0.1:6379/0")
    get_settings.cache_clear()
    try:
        for args in (["serve", "--no-migrate"], ["serve", "--no-migrate", "--workers", "2"]):
            assert CliRunner().invoke(app, args).exit_code == 0
    finally:
        get_settings.cache_clear()
    assert [kw.get("proxy_headers") for kw in calls] == [False, False]


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
        queues.EmbeddedQueue().enqueue("job-1")


def test_serve_with_several_workers_needs_a_broker(env_db, monkeypatch):
    monkeypatch.setenv("BROKER_URL", "memory://")
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["serve", "--workers", "2", "--no-migrate"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code != 0
    assert "needs a broker" in str(result.exception) + result.output
