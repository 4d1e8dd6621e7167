"""Caps on the long-lived requests: uploads in progress and open event streams.

An upload holds a socket, up to ~5 MiB of read-ahead, a temporary object and, while its bytes
arrive, a worker thread; an event stream holds a socket and polls the database every
SSE_POLL_SECONDS. Neither may grow without bound, and no team may take all of either: each
kind has a cap per team (over it: 429) and one for the process (over it: 503), both answered
at once with Retry-After, before any body byte is read or any query is made.

Neither kind ever runs in the request thread pool that every other route (and the database
session limit of api.deps) depends on: an upload's parsing runs in a thread of its own, only
once bytes are there to parse (api.bodypump.BodyPump), and stream polls share a small limiter of
their own (`stream_poll_limiter`). So a thousand slow clients cost sockets and memory, bounded
by these caps, and never the threads other teams' requests and /healthz need.

The counts are per API process, like the pools they protect: with `--workers N` or N
replicas, a team may hold N times the caps in all.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Annotated, Any

from anyio import CapacityLimiter
from fastapi import Depends, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from api.deps import CurrentTeam, pool_capacity
from api.errors import api_error

RETRY_AFTER_S = 5


class Slot:
    """One admitted upload or stream; `release()` is idempotent."""

    def __init__(self, limiter: SlotLimiter, team_id: str):
        self._limiter = limiter
        self.team_id = team_id
        self.released = False
        self.handed_over = False  # a response now owns it (SlotStreamingResponse)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._limiter._release(self.team_id)


class SlotLimiter:
    """At most `per_team` slots per team and `total` in all, refused without waiting."""

    def __init__(
        self, what: str, *, per_team: int, total: int, per_team_setting: str, total_setting: str
    ):
        self.what = what
        self.per_team = per_team
        self.total = total
        self._settings = (per_team_setting, total_setting)
        self._lock = threading.Lock()
        self._teams: dict[str, int] = {}
        self._in_use = 0

    def acquire(self, team_id: str, *, headers: dict[str, str] | None = None) -> Slot:
        """A slot for `team_id`, or raise the 429 (team's cap) or 503 (process cap) to send."""
        retry = {"Retry-After": str(RETRY_AFTER_S), **(headers or {})}
        with self._lock:
            held = self._teams.get(team_id, 0)
            if held >= self.per_team:
                raise api_error(
                    429,
                    f"this team already has {held} {self.what} open, the most one team may "
                    f"have at once ({self._settings[0]}={self.per_team}); close one, or retry "
                    "when one has ended",
                    headers=retry,
                )
            if self._in_use >= self.total:
                raise api_error(
                    503,
                    f"the server has {self._in_use} {self.what} open, its limit "
                    f"({self._settings[1]}={self.total}); retry later",
                    headers=retry,
                )
            self._teams[team_id] = held + 1
            self._in_use += 1
        return Slot(self, team_id)

    def _release(self, team_id: str) -> None:
        with self._lock:
            self._in_use -= 1
            left = self._teams.get(team_id, 1) - 1
            if left > 0:
                self._teams[team_id] = left
            else:
                self._teams.pop(team_id, None)

    def in_use(self, team_id: str | None = None) -> int:
        with self._lock:
            return self._in_use if team_id is None else self._teams.get(team_id, 0)


def _limiter(state: Any, name: str, make) -> SlotLimiter:
    limiter = getattr(state, name, None)
    if limiter is None:
        limiter = make(state.settings)
        setattr(state, name, limiter)
    return limiter


def upload_limiter(state: Any) -> SlotLimiter:
    """The app's cap on uploads in progress (UPLOAD_MAX_PER_TEAM, UPLOAD_MAX_CONCURRENT)."""
    return _limiter(state, "upload_slots", lambda s: SlotLimiter(
        "uploads in progress", per_team=s.UPLOAD_MAX_PER_TEAM, total=s.UPLOAD_MAX_CONCURRENT,
        per_team_setting="UPLOAD_MAX_PER_TEAM", total_setting="UPLOAD_MAX_CONCURRENT",
    ))  # fmt: skip


def webhook_create_limiter(state: Any) -> SlotLimiter:
    """The app's cap on webhook creates in progress (each may wait for its URL's lookup):
    WEBHOOK_CREATES_PER_TEAM, WEBHOOK_CREATES."""
    return _limiter(state, "webhook_create_slots", lambda s: SlotLimiter(
        "webhook creates in progress", per_team=s.WEBHOOK_CREATES_PER_TEAM,
        total=s.WEBHOOK_CREATES, per_team_setting="WEBHOOK_CREATES_PER_TEAM",
        total_setting="WEBHOOK_CREATES",
    ))  # fmt: skip


def stream_limiter(state: Any) -> SlotLimiter:
    """The app's cap on open event streams (STREAMS_PER_TEAM, STREAMS_TOTAL)."""
    return _limiter(state, "stream_slots", lambda s: SlotLimiter(
        "event streams", per_team=s.STREAMS_PER_TEAM, total=s.STREAMS_TOTAL,
        per_team_setting="STREAMS_PER_TEAM", total_setting="STREAMS_TOTAL",
    ))  # fmt: skip


def stream_poll_limiter(state: Any) -> CapacityLimiter:
    """Threads the event streams' database polls share, for the running event loop: the
    connections api.deps keeps out of the requests' reach (a quarter of the pool), 4 when the
    pool is unbounded. Polls wait for each other there, never for (nor instead of) a request."""
    loop = asyncio.get_running_loop()
    current = getattr(state, "stream_polls", None)
    if current is None or current[0] is not loop:
        capacity = pool_capacity(state.session_factory)
        threads = 4 if capacity is None else max(1, capacity // 4)
        current = (loop, CapacityLimiter(threads))
        state.stream_polls = current
    return current[1]


async def get_stream_slot(request: Request, team: CurrentTeam) -> AsyncIterator[Slot]:
    """A stream slot for the route; given back when the route fails, or, once the route
    returns a SlotStreamingResponse holding it, when that response ends (client gone)."""
    slot = stream_limiter(request.app.state).acquire(team.id)
    try:
        yield slot
    finally:
        if not slot.handed_over:
            slot.release()


StreamSlot = Annotated[Slot, Depends(get_stream_slot, scope="function")]


class SlotStreamingResponse(StreamingResponse):
    """A streaming response that owns a slot: released when the response ends, whether the
    stream finished or the client went away (Starlette then cancels the stream at once)."""

    def __init__(self, content: Any, *, slot: Slot, **kwargs: Any):
        super().__init__(content, **kwargs)
        slot.handed_over = True
        self.slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()
