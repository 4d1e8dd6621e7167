"""The API test fixtures (tests/api/conftest.py), on PostgreSQL only: fuzzing both
backends would double the time for no new coverage of the API code."""

import pytest

from tests.api.conftest import app, client, queue, settings, store, team_a, team_b  # noqa: F401


@pytest.fixture
def db_backend() -> str:
    return "postgresql"


@pytest.fixture
def live_server(app, team_a):  # noqa: F811 - fixtures
    """The app behind a real uvicorn (h11) on a loopback port, in a thread: (base_url, key)."""
    import socket
    import threading
    import time

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", team_a.key
    finally:
        server.should_exit = True
        thread.join(timeout=10)
