"""`client.webhooks`: create (the signing secret is returned once), list, retrieve, delete,
deliveries (the log of what was sent and how each attempt went); and `verify_webhook`, which
checks a received delivery's Standard Webhooks signature on the receiver's side.

    hook = client.webhooks.create(url="https://example.com/hooks", events=["job.succeeded"])
    save(hook.secret)                                   # whsec_...: shown only now
    event = verify_webhook(hook.secret, request.headers, request.body)   # in the receiver
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

from .._methods import endpoint, paged
from .._resource import APIResource, AsyncAPIResource, Listing, SyncAPIResource, path_id
from .._retries import NOT_GIVEN, RequestOptions
from .._steps import Steps
from ..webhook_types import Webhook, WebhookDeleted, WebhookDelivery, WebhookEventType

__all__ = ["AsyncWebhooks", "WebhookVerificationError", "Webhooks", "verify_webhook"]


class WebhookVerificationError(ValueError):
    """A delivery whose signature, id or timestamp does not check out: reject it (400)."""


def verify_webhook(
    secret: str,
    headers: Mapping[str, str],
    body: Union[bytes, str],
    *,
    tolerance_seconds: float = 300,
) -> Any:
    """The parsed JSON body of a delivery whose `webhook-signature` matches HMAC-SHA256 of
    "{webhook-id}.{webhook-timestamp}.{body}" under `secret` and whose timestamp is within
    `tolerance_seconds` of now (replays are refused); else WebhookVerificationError. Pass
    the raw body bytes, exactly as received. Deduplicate on `webhook-id`: retries reuse it."""
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id = lower.get("webhook-id")
    stamp = lower.get("webhook-timestamp")
    signatures = lower.get("webhook-signature")
    if not (msg_id and stamp and signatures):
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or signature")
    try:
        timestamp = int(stamp)
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not an integer") from None
    if abs(time.time() - timestamp) > tolerance_seconds:
        raise WebhookVerificationError("webhook-timestamp is outside the tolerance")
    raw = body.encode() if isinstance(body, str) else bytes(body)
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + raw, hashlib.sha256).digest()
    for candidate in signatures.split():
        version, _, value = candidate.partition(",")
        try:
            given = base64.b64decode(value, validate=True)
        except ValueError:
            continue
        if version == "v1" and hmac.compare_digest(given, expected):
            return json.loads(raw)
    raise WebhookVerificationError("no matching signature")


def _path(webhook_id: str, tail: str = "") -> str:
    return f"/v1/webhooks/{path_id(webhook_id, 'webhook')}{tail}"


class _Webhooks(APIResource):
    @endpoint
    def create(
        self,
        *,
        url: str,
        events: Optional[Sequence[Union[WebhookEventType, str]]] = None,
        description: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        timeout: Any = NOT_GIVEN,
    ) -> Steps[Webhook]:
        """Register `url` for the team's `events` (default: all of job.succeeded,
        job.failed, job.cancelled, evaluation.succeeded, evaluation.failed). The returned
        `secret` is never shown again. A URL that is not https, or that resolves to a
        private, loopback or link-local address, raises BadRequestError naming `url`. Retries
        reuse one Idempotency-Key: one call, one endpoint."""
        body: dict[str, Any] = {"url": url}
        if events is not None:
            body["events"] = list(events)
        if description is not None:
            body["description"] = description
        opts = RequestOptions(
            "POST", "/v1/webhooks", json=body, idempotency_key=idempotency_key, timeout=timeout
        )
        return (yield from self._call(Webhook, opts))

    @paged
    def list(self, *, limit: int = 20, after: Optional[str] = None) -> Listing[Webhook]:
        """The team's webhook endpoints, newest first."""
        return Listing("/v1/webhooks", Webhook, {"limit": limit, "after": after})

    @endpoint
    def retrieve(self, webhook_id: str) -> Steps[Webhook]:
        return (yield from self._get(_path(webhook_id), Webhook))

    @endpoint
    def delete(self, webhook_id: str) -> Steps[WebhookDeleted]:
        """Delete the endpoint: nothing more is sent to it, pending retries included."""
        opts = RequestOptions("DELETE", _path(webhook_id))
        return (yield from self._call(WebhookDeleted, opts))

    @paged
    def deliveries(
        self, webhook_id: str, *, limit: int = 20, after: Optional[str] = None
    ) -> Listing[WebhookDelivery]:
        """The endpoint's deliveries, newest first, each with its attempts (`log`)."""
        return Listing(
            _path(webhook_id, "/deliveries"), WebhookDelivery, {"limit": limit, "after": after}
        )


class Webhooks(_Webhooks, SyncAPIResource):
    """`client.webhooks`: create, list, retrieve, delete, deliveries."""


class AsyncWebhooks(_Webhooks, AsyncAPIResource):
    """`aclient.webhooks`: the same methods, awaited (`list`, `deliveries`: async paginators)."""
