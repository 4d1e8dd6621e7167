"""One error shape for every response: {"error": {"message", "type", "param", "code",
"field"?, "errors"?, "request_id"}} (OpenAI's fields and ours), whether it came from a route,
FastAPI's validation or an unexpected bug."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.observability import current_request_id
from models.db import UnstorableValue
from storage import StorageUnavailableError

log = logging.getLogger("humanline.api")

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
}


def api_error(
    status_code: int,
    message: str,
    *,
    type: str | None = None,
    field: str | None = None,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> HTTPException:
    """Build (not raise) the HTTPException of an API error; routes and deps raise it."""
    detail: dict[str, Any] = {"message": message, "type": type or ERROR_TYPES.get(status_code)}
    if field is not None:
        detail["field"] = field
    if errors is not None:
        detail["errors"] = errors
    return HTTPException(status_code, detail=detail, headers=headers)


class RequestTooLarge(HTTPException):
    """Raised while the body is still arriving (see observability.BodyLimitMiddleware).

    An HTTPException so that FastAPI's body parsing re-raises it instead of turning it into
    a generic 400."""

    def __init__(self, limit: int):
        super().__init__(
            413,
            detail={"message": f"request body larger than {limit} bytes", "type": ERROR_TYPES[413]},
        )


def _encodable(value: Any) -> Any:
    """`value` with every string's lone surrogates escaped (a request's own "\\ud800", echoed
    in a message or a field name): UTF-8 cannot encode them, and a response that fails to
    encode turns the error it reports into a 500."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_encodable(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encodable(v) for v in value]
    return value


def error_body(status_code: int, detail: Any) -> dict[str, Any]:
    """The error object of a response: every error response is built from it."""
    detail = _encodable(detail)
    if isinstance(detail, dict) and "message" in detail:
        error = dict(detail)
        error.setdefault("type", ERROR_TYPES.get(status_code, "invalid_request_error"))
    else:
        error = {"message": str(detail), "type": ERROR_TYPES.get(status_code, "api_error")}
    # OpenAI's error fields too, so its SDK reads our errors as its own
    error.setdefault("param", error.get("field"))
    error.setdefault("code", None)
    error["request_id"] = current_request_id()
    return {"error": error}


def _field(loc: tuple | list) -> str | None:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "cookie", "form"):
        parts = parts[1:]
    return ".".join(parts) or None


def validation_errors(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic/FastAPI errors → [{"field", "loc", "message", "type"}] (no echoed input)."""
    out = []
    for err in errors:
        loc = list(err.get("loc", ()))
        out.append(
            {
                "field": _field(loc),
                "loc": loc,
                "message": str(err.get("msg", "invalid value")),
                "type": str(err.get("type", "value_error")),
            }
        )
    return out


def install_error_handlers(app: FastAPI) -> None:
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_body(exc.status_code, exc.detail),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    async def request_validation_error(request: Request, exc: RequestValidationError):
        errors = validation_errors(list(exc.errors()))
        first = errors[0] if errors else {"field": None, "message": "invalid request"}
        where = f"{first['field']}: " if first["field"] else ""
        detail: dict[str, Any] = {
            "message": where + str(first["message"]),
            "type": "invalid_request_error",
            "errors": errors,
        }
        if first["field"]:
            detail["field"] = first["field"]
        return JSONResponse(error_body(422, detail), status_code=422)

    async def storage_unavailable(request: Request, exc: Exception) -> JSONResponse:
        log.error("object store unavailable: %s", exc)
        detail = {
            "message": "the object store is unavailable; retry later",
            "type": ERROR_TYPES[503],
        }
        return JSONResponse(error_body(503, detail), status_code=503, headers={"Retry-After": "5"})

    async def invalid_data(request: Request, exc: Exception) -> JSONResponse:
        # the database refused a value the request carried (PostgreSQL: a NUL character in
        # text or JSON, "?after=%00"; either backend: text that is not Unicode in a JSON
        # column, models.db.UnstorableValue): the client's input, not a server fault
        log.warning("database refused a request value: %s", str(exc).splitlines()[0][:200])
        detail = {
            "message": "a value in the request cannot be stored or searched "
            "(for instance a NUL character, or a lone UTF-16 surrogate)",
            "type": "invalid_request_error",
        }
        return JSONResponse(error_body(422, detail), status_code=422)

    app.add_exception_handler(DataError, invalid_data)
    app.add_exception_handler(UnstorableValue, invalid_data)
    app.add_exception_handler(StorageUnavailableError, storage_unavailable)
    # Starlette types a handler as taking any Exception; ours take the one they handle.
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, request_validation_error)  # type: ignore[arg-type]
