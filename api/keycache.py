"""Verified API keys, remembered for a few seconds in this process's memory.

Every authenticated request used to look its key up in the database (one query and one
worker-thread hop, a fifth of a GET's cost under load). A key that verified within the last
AUTH_CACHE_SECONDS (default 5) is trusted without a lookup. The price: a revoked key keeps
working for up to that long on each API process that saw it; AUTH_CACHE_SECONDS=0 checks
every request. Unknown keys are never remembered (the failed-auth limiter handles guessing),
and only sha256 digests are kept, never the secrets.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class TeamRef:
    """The authenticated team, as routes see it (they only ever need its id)."""

    id: str
    name: str


class KeyCache:
    def __init__(self, ttl_seconds: float, max_keys: int = 10_000):
        self.ttl = ttl_seconds
        self.max_keys = max_keys
        self._entries: dict[str, tuple[float, TeamRef]] = {}

    def get(self, digest: str) -> TeamRef | None:
        entry = self._entries.get(digest)
        if entry is None:
            return None
        if entry[0] <= time.monotonic():
            self._entries.pop(digest, None)
            return None
        return entry[1]

    def put(self, digest: str, team: TeamRef) -> None:
        if self.ttl <= 0:
            return
        if len(self._entries) >= self.max_keys:  # many keys at once: start over, stay bounded
            self._entries.clear()
        self._entries[digest] = (time.monotonic() + self.ttl, team)
