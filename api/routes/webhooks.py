"""/v1/webhooks: a team's webhook endpoints (docs/webhooks.md).

    POST   /v1/webhooks                      create; the signing secret is in this response only
    GET    /v1/webhooks                      list (newest first)
    GET    /v1/webhooks/{id}                 one endpoint (status, disabled_reason)
    DELETE /v1/webhooks/{id}                 delete: nothing more is sent to it
    GET    /v1/webhooks/{id}/deliveries      the delivery log: each event, its attempts

The URL passes the SSRF guard of models.webhook_urls here and again at every delivery. A create
never blocks other requests: its lookup runs outside the request threads, with a timeout, and
creates in progress are bounded per team and per process (api.limits).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.deps import CurrentTeam, Idempotency, IdempotencyDep, SessionDep, SettingsDep
from api.errors import api_error
from api.limits import webhook_create_limiter
from api.paging import DEFAULT_LIMIT, Cursor, Limit, fetch_page, newest_first, page_of
from api.schemas import Deleted, Page, error_responses
from models.webhook_urls import LookupsBusy, UrlRefused, check_url_async, split_url
from models.webhooks import (
    WEBHOOK_EVENTS,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
    new_secret,
)

router = APIRouter(prefix="/webhooks", tags=["webhooks"])
_ERRORS = error_responses(400, 401, 404, 409, 422, 429)
MAX_ENDPOINTS_PER_TEAM = 20


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(..., max_length=2048, examples=["https://hooks.example.com/humanline"])
    events: list[WebhookEvent] = Field(
        default_factory=lambda: list(WEBHOOK_EVENTS),  # type: ignore[arg-type]
        min_length=1,
        description="The events sent to this URL; all of them by default.",
    )
    description: str | None = Field(None, max_length=200)

    @field_validator("events")
    @classmethod
    def _unique(cls, events: list[str]) -> list[str]:
        return list(dict.fromkeys(events))


class WebhookOut(BaseModel):
    id: str
    object: str = "webhook_endpoint"
    url: str
    events: list[str]
    description: str | None
    status: str
    disabled_reason: str | None
    disabled_at: datetime | None
    created_at: datetime
    secret: str | None = Field(
        None, description="The signing secret (whsec_...): in the create response only."
    )

    @classmethod
    def of(cls, row: WebhookEndpoint, *, secret: str | None = None) -> WebhookOut:
        return cls(
            id=row.id, url=row.url, events=list(row.events), description=row.description,
            status=row.status, disabled_reason=row.disabled_reason,
            disabled_at=row.disabled_at, created_at=row.created_at, secret=secret,
        )  # fmt: skip


class AttemptOut(BaseModel):
    attempt: int
    status_code: int | None
    error: str | None
    duration_ms: int
    created_at: datetime


class DeliveryOut(BaseModel):
    id: str = Field(..., description="The webhook-id header: the same on every attempt.")
    object: str = "webhook_delivery"
    event: str
    status: str
    attempts: int
    next_attempt_at: datetime | None
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    finished_at: datetime | None
    payload: dict[str, Any]
    log: list[AttemptOut] = Field(default_factory=list)

    @classmethod
    def of(cls, row: WebhookDelivery) -> DeliveryOut:
        return cls(
            id=row.id, event=row.event, status=row.status, attempts=row.attempts,
            next_attempt_at=row.next_attempt_at if row.status == "pending" else None,
            last_status_code=row.last_status_code, last_error=row.last_error,
            created_at=row.created_at, finished_at=row.finished_at, payload=row.payload,
        )  # fmt: skip


def _owned(session: Any, webhook_id: str, team_id: str) -> WebhookEndpoint:
    row = session.get(WebhookEndpoint, webhook_id)
    if row is None or row.team_id != team_id:
        raise api_error(404, f"no webhook {webhook_id!r}", field="webhook_id")
    return row


WebhookId = Annotated[str, Path(max_length=64)]


def _count(session: Session, team_id: str) -> int:
    """The team's endpoints; the transaction ends (no connection is held across a lookup)."""
    n = session.scalar(
        select(func.count()).select_from(WebhookEndpoint).where(WebhookEndpoint.team_id == team_id)
    )
    session.commit()
    return int(n or 0)


def _over_cap(count: int) -> None:
    if count >= MAX_ENDPOINTS_PER_TEAM:
        raise api_error(
            429, f"at most {MAX_ENDPOINTS_PER_TEAM} webhooks per team",
            headers={"x-should-retry": "false"},
        )  # fmt: skip


def _insert(session: Session, team_id: str, body: WebhookCreate, idem: Idempotency):
    _over_cap(_count(session, team_id))  # again: a concurrent create may have taken the room
    secret = new_secret()
    row = WebhookEndpoint(
        team_id=team_id, url=body.url, events=body.events, description=body.description,
        secret=secret, status="enabled", consecutive_failures=0,
    )  # fmt: skip
    session.add(row)
    session.flush()
    out = WebhookOut.of(row, secret=secret).model_dump(mode="json")
    if (winner := idem.commit(201, out)) is not None:
        return winner
    return JSONResponse(out, status_code=201)


@router.post("", status_code=201, response_model=WebhookOut, responses=_ERRORS)
async def create_webhook(
    request: Request,
    body: WebhookCreate,
    team: CurrentTeam,
    session: SessionDep,
    settings: SettingsDep,
    idem: IdempotencyDep,
):
    """Register a URL for the team's events. The response carries the signing `secret`; it
    is never shown again (delete and create the endpoint to get a new one), except to a
    retry with the same Idempotency-Key.

    The URL's host is looked up in the event loop, for at most WEBHOOK_DNS_TIMEOUT_SECONDS,
    holding no request thread and no database connection; a team may have
    WEBHOOK_CREATES_PER_TEAM creates in progress (more: 429), the process WEBHOOK_CREATES
    (more: 503). A team at its endpoint cap is refused before any lookup."""
    slot = webhook_create_limiter(request.app.state).acquire(team.id)
    try:
        if (replayed := await run_in_threadpool(idem.replay, body)) is not None:
            return replayed
        try:
            split_url(body.url, settings)  # what needs no lookup, first
        except UrlRefused as exc:
            raise api_error(400, f"url {exc}", field="url") from None
        _over_cap(await run_in_threadpool(_count, session, team.id))
        request.state.db_slot.release()  # the lookup may take seconds
        try:
            await check_url_async(body.url, settings, owner=team.id)
        except LookupsBusy as exc:
            raise api_error(429, f"url {exc}", field="url", headers={"Retry-After": "10"}) from None
        except UrlRefused as exc:
            raise api_error(400, f"url {exc}", field="url") from None
        await request.state.db_slot.acquire()
        return await run_in_threadpool(_insert, session, team.id, body, idem)
    finally:
        slot.release()


@router.get("", response_model=Page[WebhookOut], responses=_ERRORS)
def list_webhooks(
    team: CurrentTeam, session: SessionDep, after: Cursor = None, limit: Limit = DEFAULT_LIMIT
):
    query = select(WebhookEndpoint).where(WebhookEndpoint.team_id == team.id)
    return fetch_page(session, query, WebhookEndpoint.id, after, limit, WebhookOut)


@router.get("/{webhook_id}", response_model=WebhookOut, responses=_ERRORS)
def get_webhook(webhook_id: WebhookId, team: CurrentTeam, session: SessionDep):
    return WebhookOut.of(_owned(session, webhook_id, team.id))


@router.delete("/{webhook_id}", response_model=Deleted, responses=_ERRORS)
def delete_webhook(webhook_id: WebhookId, team: CurrentTeam, session: SessionDep):
    """Delete the endpoint, its pending deliveries and its log: nothing more is sent to it
    (a delivering worker checks the row before every attempt)."""
    row = _owned(session, webhook_id, team.id)
    session.delete(row)
    session.commit()
    return Deleted(id=webhook_id, object="webhook_endpoint")


@router.get("/{webhook_id}/deliveries", response_model=Page[DeliveryOut], responses=_ERRORS)
def list_deliveries(
    webhook_id: WebhookId,
    team: CurrentTeam,
    session: SessionDep,
    after: Cursor = None,
    limit: Limit = DEFAULT_LIMIT,
):
    """The endpoint's deliveries, newest first, each with its attempts (status code, error,
    duration)."""
    endpoint = _owned(session, webhook_id, team.id)
    query = select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint.id)
    rows = list(session.execute(newest_first(query, WebhookDelivery.id, after, limit)).scalars())
    page = page_of(rows, limit, DeliveryOut)
    seqs = {r.id: r.seq for r in rows[:limit]}
    attempts: dict[int, list[AttemptOut]] = defaultdict(list)
    for a in session.scalars(
        select(WebhookAttempt)
        .where(WebhookAttempt.delivery_seq.in_(list(seqs.values())))
        .order_by(WebhookAttempt.id)
    ):
        attempts[a.delivery_seq].append(AttemptOut.model_validate(a, from_attributes=True))
    for item in page.data:
        item.log = attempts[seqs[item.id]]
    return page
