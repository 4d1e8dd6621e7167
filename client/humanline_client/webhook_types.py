"""Typed response objects of the webhooks resource (client.webhooks): endpoints, deliveries
and each delivery's attempts. Like every response, unknown fields a newer server adds are kept."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Optional, Union  # Python >= 3.9

from pydantic import Field

from .types import BaseModel

__all__ = ["Webhook", "WebhookAttempt", "WebhookDeleted", "WebhookDelivery", "WebhookEventType"]

WebhookEventType = Literal[
    "job.succeeded", "job.failed", "job.cancelled", "evaluation.succeeded", "evaluation.failed"
]


class Webhook(BaseModel):
    """A webhook endpoint. `secret` (whsec_...) is set in the response of `create` only:
    keep it, it signs every delivery. `status` is "disabled" (with `disabled_reason`) after
    repeated failed deliveries."""

    id: str
    object: str = "webhook_endpoint"
    url: str
    events: list[str] = Field(default_factory=list)
    description: Optional[str] = None
    status: Union[Literal["enabled", "disabled"], str] = "enabled"
    disabled_reason: Optional[str] = None
    disabled_at: Optional[datetime] = None
    created_at: Optional[datetime] = None
    secret: Optional[str] = None


class WebhookDeleted(BaseModel):
    id: str
    object: str = "webhook_endpoint"
    deleted: bool = True


class WebhookAttempt(BaseModel):
    attempt: int
    status_code: Optional[int] = None
    error: Optional[str] = None
    duration_ms: int = 0
    created_at: Optional[datetime] = None


class WebhookDelivery(BaseModel):
    """One event sent to an endpoint: `id` is its webhook-id header (the same on every
    attempt); `log` holds each attempt. `status`: pending, delivered, failed, cancelled."""

    id: str
    object: str = "webhook_delivery"
    event: str
    status: str
    attempts: int = 0
    next_attempt_at: Optional[datetime] = None
    last_status_code: Optional[int] = None
    last_error: Optional[str] = None
    created_at: Optional[datetime] = None
    finished_at: Optional[datetime] = None
    payload: dict[str, Any] = Field(default_factory=dict)
    log: list[WebhookAttempt] = Field(default_factory=list)
