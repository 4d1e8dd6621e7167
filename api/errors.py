"""The API's errors: `api_error` (what routes and deps raise) and the handlers that answer
every error, whether it came from a route, FastAPI's validation or an unexpected bug, with one
body (api.error_bodies)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.error_bodies import ERROR_TYPES, error_body
from api.observability import current_request_id
from models.db import UnstorableValue
from storage import StorageUnavailableError

log = logging.getLogger("humanline.api")


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


def error_response(
    status_code: int, detail: Any, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The JSON response of an error, with the current request's id."""
    body = error_body(status_code, detail, current_request_id())
    return JSONResponse(body, status_code=status_code, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, exc.detail, getattr(exc, "headers", None))

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
        return error_response(422, detail)

    async def storage_unavailable(request: Request, exc: Exception) -> JSONResponse:
        log.error("object store unavailable: %s", exc)
        detail = {
            "message": "the object store is unavailable; retry later",
            "type": ERROR_TYPES[503],
        }
        return error_response(503, detail, {"Retry-After": "5"})

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
        return error_response(422, detail)

    app.add_exception_handler(DataError, invalid_data)
    app.add_exception_handler(UnstorableValue, invalid_data)
    app.add_exception_handler(StorageUnavailableError, storage_unavailable)
    # Starlette types a handler as taking any Exception; ours take the one they handle.
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, request_validation_error)  # type: ignore[arg-type]
