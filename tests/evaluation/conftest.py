"""Evaluation fixtures: the local OpenAI-compatible server (a real tiny-llama behind real
HTTP), a scripted misbehaving server, and a tiny reward model (headless Chromium:
tests.fixtures.browser)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.fixtures.live import free_port

REPO = Path(__file__).resolve().parents[2]
API_KEY = "sk-test-local"


@dataclass
class LocalServer:
    base_url: str
    model: str
    api_key: str
    proc: subprocess.Popen


@pytest.fixture(scope="session")
def local_openai_server() -> Iterator[LocalServer]:
    """`python -m tools.openai_server --model tiny-llama` on a free port."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tools.openai_server",
            "--model",
            "tiny-llama",
            "--port",
            str(port),
            "--api-key",
            API_KEY,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("local OpenAI server did not start in 120 s")
            time.sleep(0.2)
        yield LocalServer(url + "/v1", "tiny-llama", API_KEY, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def completion(content: str) -> dict:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
    }


@dataclass
class ScriptedServer:
    """Answers POST /v1/chat/completions following `script`, one action per request (the
    last repeats): ("ok", text) | ("status", code, retry_after|None) | ("sleep", seconds) |
    ("drip", seconds) (headers, then one byte every 0.2 s for that long) | ("garbage",)."""

    script: list[tuple] = field(default_factory=lambda: [("ok", "A")])
    requests: list[dict] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    base_url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_action(self) -> tuple:
        with self.lock:
            i = len(self.times)
            self.times.append(time.monotonic())
        return self.script[min(i, len(self.script) - 1)]


@pytest.fixture
def scripted_server() -> Iterator[ScriptedServer]:
    state = ScriptedServer()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.requests.append(
                {
                    "body": json.loads(body or b"{}"),
                    "authorization": self.headers.get("Authorization"),
                }
            )
            action = state.next_action()
            try:
                if action[0] == "ok":
                    self._send(200, json.dumps(completion(action[1])).encode())
                elif action[0] == "status":
                    headers = {"Retry-After": str(action[2])} if action[2] is not None else {}
                    self._send(action[1], b'{"error": {"message": "scripted"}}', headers)
                elif action[0] == "sleep":
                    time.sleep(action[1])
                    self._send(200, json.dumps(completion("A")).encode())
                elif action[0] == "drip":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    end = time.monotonic() + action[1]
                    while time.monotonic() < end:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(0.2)
                elif action[0] == "garbage":
                    self._send(200, b"<html>not json</html>")
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _send(self, code: int, body: bytes, headers: dict | None = None):
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def reward_model_dir(tmp_path_factory) -> Path:
    """A tiny random sequence-classification model (1 label) with tiny-llama's tokenizer."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForSequenceClassification

    from trainer.modeling import resolve_model

    base = resolve_model("tiny-llama")
    out = tmp_path_factory.mktemp("rm")
    config = AutoConfig.from_pretrained(base)
    config.num_labels = 1
    tokenizer = AutoTokenizer.from_pretrained(base)
    config.pad_token_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
