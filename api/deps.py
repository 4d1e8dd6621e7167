"""FastAPI dependencies: settings, DB session, object store, auth, idempotency.

The work queues are api.queues; "owned by this team or 404" is api.owned; paging api.paging.

Routes declare what they need with the Annotated aliases at the bottom (`SessionDep`,
`CurrentTeam`, ...). Everything comes from `app.state`, set once by api.main.create_app, so
tests inject their own store and queue there.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from anyio import CapacityLimiter
from fastapi import Depends, Header, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import QueuePool
from starlette.concurrency import run_in_threadpool

from api.errors import api_error
from api.keycache import KeyCache, TeamRef
from api.ratelimit import AuthFailureLimiter, client_address
from models.settings import Settings
from models.tables import IdempotencyKey
from models.teams import DISPLAY_CHARS, hash_secret, team_for_key
from storage import ObjectStore

log = logging.getLogger("humanline.api")


# --- plain state ----------------------------------------------------------------------------
#
# Dependencies that do no I/O are `async def`: FastAPI runs a plain `def` dependency in a
# worker thread, and each such hop (two thread switches, a wake-up of the event loop) costs
# more than the function itself. Only what talks to the database runs in threads.


async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


def pool_capacity(factory: sessionmaker[Session]) -> int | None:
    """How many connections the sessions' engine can hand out at once (None: no bound)."""
    pool = getattr(factory.kw.get("bind"), "pool", None)
    if not isinstance(pool, QueuePool):
        return None
    overflow = getattr(pool, "_max_overflow", 0)
    return None if overflow < 0 else pool.size() + overflow


class DbSlot:
    """A request's permission to use a pooled connection (see get_session)."""

    def __init__(self, semaphore: asyncio.Semaphore | None):
        self._semaphore = semaphore
        self.held = False

    async def acquire(self) -> None:
        if self._semaphore is not None and not self.held:
            await self._semaphore.acquire()
        self.held = True

    def release(self) -> None:
        if self._semaphore is not None and self.held:
            self._semaphore.release()
        self.held = False


def _db_semaphore(state: Any) -> asyncio.Semaphore | None:
    """The app's limit on requests holding a session, for the running event loop (one per
    loop: the test client runs each request on a fresh loop). A quarter of the pool stays
    free for what opens sessions outside requests (event-stream polls, metrics scrapes)."""
    loop = asyncio.get_running_loop()
    current = getattr(state, "db_slots", None)
    if current is None or current[0] is not loop:
        capacity = pool_capacity(state.session_factory)
        slots = None if capacity is None else max(1, capacity - max(1, capacity // 4))
        current = (loop, asyncio.Semaphore(slots) if slots else None)
        state.db_slots = current
    return current[1]


async def get_session(request: Request) -> AsyncIterator[Session]:
    """One session per request, closed as soon as the route function returns (the
    dependency's scope is "function": a streamed response does not keep it).

    At most a pool's worth of requests hold a session at once; the others wait here, in the
    event loop. Without that limit, worker threads block inside the pool's checkout (for up
    to 30 s) while the requests owning the connections wait for a free worker thread to run
    their next step: the thread-pool/connection-pool deadlock that turns a burst of load
    into a wall of timeouts. Creating a session does no I/O; closing one with an open
    transaction does (ROLLBACK), in a thread outside the request thread limit."""
    state = request.app.state
    slot = DbSlot(_db_semaphore(state))
    await slot.acquire()
    request.state.db_slot = slot  # a long route (an upload) gives it back while it waits
    try:
        session = state.session_factory()
        try:
            yield session
        finally:
            if session.in_transaction():
                await anyio.to_thread.run_sync(session.close, limiter=CapacityLimiter(1))
            else:
                session.close()
    finally:
        slot.release()


def autocommit_reads(session: Session) -> None:
    """Run a read-only request's statements without a transaction, if none is open yet: one
    round trip per query instead of BEGIN, the query and COMMIT (a third of a job listing's
    database waits). The connection's usual isolation comes back when it returns to the pool."""
    if not session.in_transaction():
        session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})


def end_transaction(session: Session) -> None:
    """End a read-only request's transaction in the route's own worker thread: its
    connection goes back to the pool now, and the session needs no I/O when it is closed
    (loaded objects stay usable: sessions do not expire them on commit)."""
    session.commit()


async def get_store(request: Request) -> ObjectStore:
    return request.app.state.store


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
StoreDep = Annotated[ObjectStore, Depends(get_store)]


# --- auth -------------------------------------------------------------------------------------


def auth_limiter(request: Request) -> AuthFailureLimiter:
    """The app's failed-authentication limiter (api/ratelimit.py), made on first use."""
    limiter = getattr(request.app.state, "auth_limiter", None)
    if limiter is None:
        limiter = request.app.state.auth_limiter = AuthFailureLimiter()
    return limiter


_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer hl_...`")


def key_cache(request: Request) -> KeyCache:
    """The app's cache of verified keys (api/keycache.py), made on first use."""
    cache = getattr(request.app.state, "key_cache", None)
    if cache is None:
        ttl = request.app.state.settings.AUTH_CACHE_SECONDS
        cache = request.app.state.key_cache = KeyCache(ttl)
    return cache


def _lookup_team(session: Session, secret: str) -> TeamRef | None:
    team = team_for_key(session, secret)
    return None if team is None else TeamRef(team.id, team.name)


async def get_current_team(
    request: Request,
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> TeamRef:
    """The key's team. Async: a key verified in the last AUTH_CACHE_SECONDS costs no query
    and no thread hop; only a lookup runs in a worker thread."""
    challenge = {"WWW-Authenticate": "Bearer"}
    limiter = auth_limiter(request)
    settings = request.app.state.settings
    client = "ip:" + client_address(
        request.client.host if request.client else None,
        request.headers.get("x-forwarded-for"),
        settings.trusted_proxies,
    )
    secret = credentials.credentials.strip() if credentials is not None else ""
    if credentials is None or credentials.scheme.lower() != "bearer":
        secret = ""
    team = None
    if secret:
        cache, digest = key_cache(request), hash_secret(secret)
        team = cache.get(digest)
        if team is None:
            # Looked up even while this client is blocked: a valid key is always served.
            team = await run_in_threadpool(_lookup_team, session, secret)
            if team is not None:
                cache.put(digest, team)
    if team is None:
        buckets = (client, "key:" + secret[:DISPLAY_CHARS]) if secret else (client,)
        waits = [w for b in buckets if (w := limiter.retry_after(b)) is not None]
        for bucket in buckets:
            limiter.failure(bucket)
        if waits:
            raise api_error(
                429, "too many failed authentications; retry later",
                headers={"Retry-After": str(max(waits))},
            )
        if not secret:
            raise api_error(
                401, "missing API key: send 'Authorization: Bearer hl_...'", headers=challenge
            )
        raise api_error(401, "invalid or revoked API key", headers=challenge)
    request.state.team_id = team.id  # for the access log; never the key itself
    return team


CurrentTeam = Annotated[TeamRef, Depends(get_current_team)]


# --- idempotency ------------------------------------------------------------------------------

_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")


def request_hash(request: Any) -> str:
    """sha256 of a canonical JSON rendering: key order and whitespace do not matter. A
    pydantic body counts by the fields the client sent (defaults filled later are not the
    request)."""
    if isinstance(request, BaseModel):
        request = request.model_dump(mode="json", exclude_unset=True)
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class Idempotency:
    """`Idempotency-Key` handling for one POST (DESIGN.md §6).

    Usage in a route: `if (r := idem.replay(request)) is not None: return r` (`request`: what
    identifies it, a body or a JSON-able value, compared by `request_hash`), do the work in
    the session without committing, then `if (r := idem.commit(201, body)) is not None:` a
    concurrent request with the same key won (our work was rolled back; undo side effects and
    return r). Only successful responses are remembered: a rejected request can be retried
    with the same key. Without a key both are plain: nothing is hashed, looked up or stored.
    """

    def __init__(self, session: Session, team_id: str, key: str | None, method_path: str):
        self.session = session
        self.team_id = team_id
        self.key = key
        self.method_path = method_path
        self.request_hash: str | None = None  # set by replay() when there is a key

    def replay(self, request: Any) -> JSONResponse | None:
        """The stored response when this key already answered this request; 409 when it
        answered another one; None when the key is new (or there is none)."""
        if self.key is None:
            return None
        self.request_hash = request_hash(request)
        return self._stored()

    def _stored(self) -> JSONResponse | None:
        row = self.session.execute(
            select(IdempotencyKey).where(
                IdempotencyKey.team_id == self.team_id, IdempotencyKey.key == self.key
            )
        ).scalar_one_or_none()
        if row is None:
            return None
        if row.method_path != self.method_path or row.request_hash != self.request_hash:
            raise api_error(
                409,
                "this Idempotency-Key was already used with a different request; "
                "use a new key for a new request",
                field="Idempotency-Key",
            )
        return JSONResponse(
            row.response_body,
            status_code=row.response_status,
            headers={"Idempotent-Replayed": "true"},
        )

    def commit(self, status_code: int, body: dict[str, Any]) -> JSONResponse | None:
        """Commit the route's work, remembering `body` under the key; the winner's response
        when a concurrent request with the key committed first."""
        if self.key is not None:
            if self.request_hash is None:
                raise RuntimeError("Idempotency.commit() before replay(): no request to remember")
            self.session.add(
                IdempotencyKey(
                    team_id=self.team_id,
                    key=self.key,
                    method_path=self.method_path,
                    request_hash=self.request_hash,
                    response_status=status_code,
                    response_body=body,
                )
            )
        try:
            self.session.commit()
        except IntegrityError:
            self.session.rollback()
            if self.key is not None:
                winner = self._stored()
                if winner is not None:
                    return winner
            raise
        return None


async def get_idempotency(
    request: Request,
    session: SessionDep,
    team: CurrentTeam,
    idempotency_key: Annotated[
        str | None,
        Header(
            description="Retry-safe POSTs: the same key and body return the original "
            "response; the same key with another body is a 409."
        ),
    ] = None,
) -> Idempotency:
    if idempotency_key is not None and not _KEY.match(idempotency_key):
        raise api_error(
            400, "Idempotency-Key must be 1-255 visible ASCII characters", field="Idempotency-Key"
        )
    return Idempotency(session, team.id, idempotency_key, f"{request.method} {request.url.path}")


IdempotencyDep = Annotated[Idempotency, Depends(get_idempotency)]
