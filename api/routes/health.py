"""Liveness and readiness (unauthenticated, outside /v1); Prometheus metrics where the
operator puts them (METRICS_PORT, METRICS_ON_API_PORT; api.main)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from api.schemas import Health

router = APIRouter(tags=["health"])
metrics_router = APIRouter(include_in_schema=False)


@router.get("/healthz", response_model=Health)
async def healthz():
    """The process is up. Answered in the event loop: it waits behind no thread, database
    connection or upload, so a saturated request pool never fails the liveness probe."""
    return Health()


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(request: Request):
    """The process can serve: its database answers."""
    try:
        with request.app.state.session_factory() as session:
            session.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        body = Health(status="unavailable", checks={"database": type(exc).__name__})
        return JSONResponse(body.model_dump(), status_code=503)
    return Health(checks={"database": "ok"})


@metrics_router.get("/metrics")
def metrics(request: Request):
    """Only with METRICS_ON_API_PORT: the API port is the teams' (see api.main)."""
    return Response(
        generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )
