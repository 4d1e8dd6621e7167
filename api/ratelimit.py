"""Failed-authentication rate limit: a token bucket per client IP, in this process's memory.

Every request with a missing, malformed or unknown API key takes a token from its client's
bucket (AUTH_FAILURES_PER_MINUTE, default 20, refilled continuously); once the bucket is
empty that client gets 429 with Retry-After for every authenticated route, whatever key it
sends, until a token is back. Valid keys take no token. An online brute force of the
256-bit keys was hopeless anyway; this stops it costing a DB lookup per guess and makes it
visible.

The buckets are per API process: with N replicas a client gets up to N times the budget, so
multi-replica deployments should also rate-limit at the ingress (by client IP, on 401s).
The client IP is the socket peer (request.client): run uvicorn with --proxy-headers and
--forwarded-allow-ips for the ingress so that it is the real client's.
"""

from __future__ import annotations

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
