"""Liveness, readiness and Prometheus metrics (unauthenticated, outside /v1)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz():
    """The process is up."""
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


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request):
    return Response(
        generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )
