"""Request ids, structured JSON logs, Prometheus metrics and the request-body size limit.

One pure-ASGI middleware does all four (no BaseHTTPMiddleware, which buffers streaming
responses). Logs never carry headers, so API keys cannot leak into them.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fastapi import HTTPException
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.error_bodies import error_body

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "humanline_request_id", default=None
)
_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
access_log = logging.getLogger("humanline.api.access")
log = logging.getLogger("humanline.api")


def current_request_id() -> str | None:
    return _request_id.get()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, request_id, and extras."""

    _RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = current_request_id()
        if request_id:
            out["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in self._RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str = "INFO", json_logs: bool = True) -> None:
    """Give the humanline loggers one handler on stderr (idempotent)."""
    root = logging.getLogger("humanline")
    root.setLevel(level.upper())
    for handler in list(root.handlers):
        if getattr(handler, "_humanline", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler._humanline = True  # type: ignore[attr-defined]
    handler.setFormatter(
        JsonFormatter() if json_logs else logging.Formatter("%(levelname)s %(name)s %(message)s")
    )
    root.addHandler(handler)
    root.propagate = False


class Metrics:
    """The app's Prometheus registry (one per app, so tests can build many apps)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "humanline_http_requests_total",
            "HTTP requests by route and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "humanline_http_request_duration_seconds",
            "Time to the end of the response.",
            ["method", "route"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )


def route_template(scope: Scope) -> str:
    """The matched route as a low-cardinality label: "/v1/jobs/{job_id}", not the raw path
    (ids would make one time series per object). "unmatched" for 404s of unknown paths."""
    if scope.get("route") is None:
        return "unmatched"
    params = {str(v): k for k, v in (scope.get("path_params") or {}).items()}
    return "/".join(
        f"{{{params[seg]}}}" if seg in params else seg for seg in scope.get("path", "").split("/")
    )


MAX_HEADER_BYTES = 32 * 1024  # all names and values together (nginx: 4 x 8 KiB)
CLIENT_CLOSED = 499  # the status nginx logs for a request its client abandoned


class RequestMiddleware:
    """Per request: X-Request-ID in/out, body size limit, metrics, one access-log line, and a
    JSON 500 (with the request id) instead of a stack trace for an unexpected exception. A
    client that disconnects mid-request is logged as status 499, not as an error."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        body_limit: Callable[[Scope], int],
        too_large: Callable[[int], Exception],
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.body_limit = body_limit
        self.too_large = too_large

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        incoming = headers.get("x-request-id", "")
        request_id = incoming if _SAFE_REQUEST_ID.match(incoming) else uuid.uuid4().hex
        token = _request_id.set(request_id)
        start = time.perf_counter()
        status = 500
        started = False
        limit = self.body_limit(scope)

        async def send_wrapper(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                message = dict(message)
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-request-id", request_id.encode()),
                ]
            await send(message)

        received = 0

        async def receive_wrapper() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise self.too_large(limit)
            return message

        try:
            if sum(len(k) + len(v) for k, v in scope["headers"]) > MAX_HEADER_BYTES:
                # httptools (uvicorn's default parser) has no header limit of its own
                detail = {"message": "request headers too large", "type": "invalid_request_error"}
                raise HTTPException(431, detail=detail)
            declared = headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise self.too_large(limit)
            await self.app(scope, receive_wrapper, send_wrapper)
        except ClientDisconnect:  # the client left mid-request (an upload cut short): no fault
            status = CLIENT_CLOSED
            log.info("client disconnected", extra={"path": scope.get("path")})
        except Exception as exc:  # the app's handlers missed it: never leak a trace
            status = getattr(exc, "status_code", 500)
            if status >= 500:
                log.exception("unhandled error", extra={"path": scope.get("path")})
            if not started:
                detail = getattr(exc, "detail", None) or {
                    "message": "internal server error",
                    "type": "internal_error",
                }
                body = json.dumps(error_body(status, detail, request_id)).encode()
                await send_wrapper(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send_wrapper({"type": "http.response.body", "body": body})
        finally:
            elapsed = time.perf_counter() - start
            template = route_template(scope)
            method = scope.get("method", "")
            self.metrics.requests.labels(method, template, str(status)).inc()
            self.metrics.latency.labels(method, template).observe(elapsed)
            access_log.info(
                "request",
                extra={
                    "method": method,
                    "path": scope.get("path"),
                    "route": template,
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 2),
                    "team_id": scope.get("state", {}).get("team_id"),
                },
            )
            _request_id.reset(token)
