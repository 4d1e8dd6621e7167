"""One error shape for every response: {"error": {"message", "type", "param", "code",
"field"?, "errors"?, "request_id"}} (OpenAI's fields and ours). Below api.observability (its
last-resort 500) and api.errors (the app's handlers): both build their bodies here."""

from __future__ import annotations

from typing import Any

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


def error_body(status_code: int, detail: Any, request_id: str | None) -> dict[str, Any]:
    """The error object of a response: every error response is built from it. `detail`: an
    HTTPException's (a dict with "message", or anything else, shown as text); `request_id`:
    the request's (api.observability.current_request_id)."""
    detail = _encodable(detail)
    if isinstance(detail, dict) and "message" in detail:
        error = dict(detail)
        error.setdefault("type", ERROR_TYPES.get(status_code, "invalid_request_error"))
    else:
        error = {"message": str(detail), "type": ERROR_TYPES.get(status_code, "api_error")}
    # OpenAI's error fields too, so its SDK reads our errors as its own
    error.setdefault("param", error.get("field"))
    error.setdefault("code", None)
    error["request_id"] = request_id
    return {"error": error}
