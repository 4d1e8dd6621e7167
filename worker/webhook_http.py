"""One webhook attempt over HTTP (docs/webhooks.md): signed as Standard Webhooks do, sent to
the address the SSRF guard checked, and bounded by one deadline for all of it.

    code, error = send_once(url, secret, msg_id, payload, settings, client=client)

WEBHOOK_TIMEOUT_SECONDS is the whole attempt's: the lookup (at most
WEBHOOK_DNS_TIMEOUT_SECONDS of it), connect, TLS, the request and the response's status line.
httpx's timeouts are per operation (a receiver dripping one byte per `timeout` would hold the
attempt forever), so a timer shuts the attempt's socket down when the deadline passes: the
blocked read returns at once and the attempt fails as timed out. Each attempt has a connection
of its own (`connection: close`), so the socket the timer closes is this attempt's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from models.settings import Settings
from models.webhook_urls import Resolver, Target, UrlRefused, bounded, check_url, resolve
from models.webhooks import SECRET_PREFIX

USER_AGENT = "humanline-webhooks/1"


# --- signing (https://www.standardwebhooks.com) -----------------------------------------------


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, keyed by the secret's bytes."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def signed_headers(secret: str, msg_id: str, body: bytes, timestamp: int | None = None) -> dict:
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }


# --- one attempt ---------------------------------------------------------------------------------


def _pinned(url: str, target: Target) -> tuple[str, dict[str, str], dict[str, str]]:
    """(URL with the checked address as host, Host header, httpx extensions for TLS SNI)."""
    parts = urlsplit(url)
    ip = target.addresses[0]
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    pinned = urlunsplit((parts.scheme, f"{host}:{target.port}", parts.path or "/", parts.query, ""))
    netloc = parts.netloc.rsplit("@", 1)[-1]
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    return pinned, {"host": netloc}, extensions


class Deadline:
    """Shuts down the attempt's socket `seconds` from now (httpcore's trace hook hands it over
    as the connection opens); `expired` says whether it did."""

    def __init__(self, seconds: float):
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.expired = False
        self._timer = threading.Timer(max(seconds, 0.0), self._expire)
        self._timer.daemon = True

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event != "connection.connect_tcp.complete":
            return
        sock = info["return_value"].get_extra_info("socket")
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            late = self.expired
        if late:
            _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:  # shutdown, not close: it wakes a recv blocked in another thread
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def send_once(
    url: str, secret: str, msg_id: str, payload: dict, settings: Settings, *,
    client: httpx.Client, resolver: Resolver = resolve, owner: str | None = None,
) -> tuple[int | None, str | None]:  # fmt: skip
    """POST one delivery: (status code or None, error or None). 2xx is success. `owner`: the
    team, whose lookups still running are bounded (models.webhook_urls)."""
    budget = settings.WEBHOOK_TIMEOUT_SECONDS
    timed_out = f"timed out: no answer within the attempt's {budget:g}s"
    end = time.monotonic() + budget
    lookup = min(settings.WEBHOOK_DNS_TIMEOUT_SECONDS, budget)
    try:
        target = check_url(url, settings, resolver=bounded(resolver, lookup, owner))
    except UrlRefused as exc:
        return None, f"url refused at delivery: {exc}"
    left = end - time.monotonic()
    if left <= 0:
        return None, timed_out
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    pinned, host, extensions = _pinned(url, target)
    headers = {**signed_headers(secret, msg_id, body), **host, "connection": "close"}
    deadline = Deadline(left)
    try:
        with deadline, client.stream(
            "POST", pinned, content=body, headers=headers, timeout=left,
            extensions={**extensions, "trace": deadline.trace},
        ) as response:  # fmt: skip
            code = response.status_code  # the body is never read
    except httpx.TimeoutException:
        return None, timed_out
    except Exception as exc:  # noqa: BLE001 - any failure is a failed attempt, logged
        if deadline.expired:
            return None, timed_out
        return None, f"{type(exc).__name__}: {exc}"[:500]
    return code, None if 200 <= code < 300 else f"HTTP {code}"
