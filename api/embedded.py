"""The embedded default in one process, for scripts that drive the product end to end
(`make demo`, `benchmarks/replicate.py`): SQLite, the local object store and the in-process
worker under one directory, the API served over real HTTP on a free loopback port.

    with EmbeddedService(Path(".humanline/demo"), team="demo") as service:
        client = Client(base_url=service.base_url, api_key=service.key)

The environment is set before anything reads the settings, so call it first in the script.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any


def embedded_environment(root: Path) -> dict[str, str]:
    """Settings of the embedded default with every file under `root`."""
    return {
        "DATABASE_URL": f"sqlite:///{root / 'humanline.db'}",
        "STORAGE_URL": f"file://{root / 'objects'}",
        "BROKER_URL": "memory://",
        "WORKER_DIR": str(root / "work"),
        "KEEP_RUN_DIRS": "true",
        "LOG_LEVEL": "WARNING",
        "HF_HUB_OFFLINE": "1",
    }


class EmbeddedService:
    """Migrate, create a team and an API key, serve the API, start the worker; `close()` (or
    leaving the `with` block) stops the worker and the server."""

    def __init__(
        self, root: Path, team: str = "local", fresh: bool = True, env: dict[str, str] | None = None
    ):
        self.root = Path(root)
        if fresh:
            shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        os.environ.update({**embedded_environment(self.root), **(env or {})})
        self.team = team
        self.base_url = ""
        self.key = ""
        self._server: Any = None
        self._worker: Any = None

    def __enter__(self) -> EmbeddedService:
        import uvicorn

        from api.cli import migrate_database, start_embedded_worker
        from api.main import create_app
        from models.db import make_engine, make_session_factory, session_scope
        from models.settings import get_settings
        from models.teams import create_api_key, create_team, get_team

        get_settings.cache_clear()  # the environment above is what this process serves
        settings = get_settings()
        migrate_database(settings.DATABASE_URL)
        with session_scope(make_session_factory(make_engine(settings.DATABASE_URL))) as session:
            team = get_team(session, self.team) or create_team(session, self.team)
            _, self.key = create_api_key(session, team.id, self.team)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        config = uvicorn.Config(
            create_app(settings), host="127.0.0.1", port=port, log_level="warning"
        )
        self._server = uvicorn.Server(config)
        threading.Thread(target=self._server.run, daemon=True).start()
        while not self._server.started:
            time.sleep(0.05)
        self.base_url = f"http://127.0.0.1:{port}"
        self._worker = start_embedded_worker(settings)
        return self

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        if self._server is not None:
            self._server.should_exit = True
            self._server = None

    def __exit__(self, *exc: object) -> None:
        self.close()
