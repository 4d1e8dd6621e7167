"""Failed-authentication rate limit: token buckets in this process's memory, one per client
and one per key prefix.

Every request with a missing, malformed or unknown API key takes a token from its client's
bucket and from its key prefix's (the first characters of the key, models.teams.DISPLAY_CHARS)
(AUTH_FAILURES_PER_MINUTE, default 20, refilled continuously); once either is empty, unknown
keys get 429 with Retry-After instead of 401. A key that verifies is always served: behind an
ingress every team may share one client address, and 20 bad keys from one team must not lock
the others (or that team's valid keys) out. The key space (256 bits) makes guessing hopeless
anyway; the buckets make it visible and slow, and a blocked client's guesses still cost one
indexed lookup each.

The client is the socket peer, or, when the peer is listed in TRUSTED_PROXIES, the rightmost
X-Forwarded-For address that is not a trusted proxy (client_address): a forwarded header from
anyone else is ignored, so rotating it buys no fresh buckets.

The buckets are per API process: with N replicas a client gets up to N times the budget, so
multi-replica deployments should also rate-limit at the ingress (by client IP, on 401s).
"""

from __future__ import annotations

import ipaddress
import math
import os
import threading
import time
from collections import OrderedDict


class AuthFailureLimiter:
    def __init__(
        self,
        per_minute: float | None = None,
        burst: float | None = None,
        max_clients: int = 10_000,
        clock=time.monotonic,
    ):
        if per_minute is None:
            per_minute = float(os.environ.get("AUTH_FAILURES_PER_MINUTE", "20"))
        self.rate = per_minute / 60.0  # tokens per second
        self.capacity = float(burst if burst is not None else per_minute)
        self.max_clients = max_clients
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # ip: (tokens, t)

    def _tokens(self, client: str, now: float) -> float:
        tokens, then = self._buckets.get(client, (self.capacity, now))
        return min(self.capacity, tokens + (now - then) * self.rate)

    def retry_after(self, client: str) -> int | None:
        """Seconds until `client` may try again, or None when it may now."""
        if self.rate <= 0 and self.capacity <= 0:
            return None  # disabled
        with self._lock:
            if client not in self._buckets:
                return None
            tokens = self._tokens(client, self.clock())
        if tokens >= 1:
            return None
        return max(1, math.ceil((1 - tokens) / self.rate)) if self.rate > 0 else 60

    def failure(self, client: str) -> None:
        now = self.clock()
        with self._lock:
            tokens = self._tokens(client, now)
            self._buckets[client] = (max(0.0, tokens - 1), now)
            self._buckets.move_to_end(client)
            while len(self._buckets) > self.max_clients:  # bounded memory: forget the oldest
                self._buckets.popitem(last=False)


def client_address(peer: str | None, forwarded_for: str | None, trusted: tuple) -> str:
    """The client a failure is charged to: the socket peer, unless the peer is a trusted proxy
    (TRUSTED_PROXIES); then the rightmost X-Forwarded-For address that is not one, so a client
    cannot pick its own bucket by sending the header (an untrusted peer's is ignored, and a
    trusted ingress appends the address it saw)."""
    if not peer:
        return "?"
    if not trusted or not _trusted(peer, trusted) or not forwarded_for:
        return peer
    for hop in reversed([h.strip() for h in forwarded_for.split(",")]):
        if not _trusted(hop, trusted):
            return hop if _is_ip(hop) else peer
    return peer


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def _trusted(address: str, trusted: tuple) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in trusted)
