"""The FastAPI application: `create_app(settings)` wires settings, DB, store, queue, routes.

uvicorn --factory api.main:server_app     # or: humanline-server serve [--workers N]
"""

from __future__ import annotations

import gc
import sys

from fastapi import FastAPI
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import Scope

from api.deps import JobQueue, default_queue
from api.errors import RequestTooLarge, install_error_handlers
from api.observability import Metrics, RequestMiddleware, configure_logging
from api.routes import evaluations, files, health, jobs, reports
from models.db import make_engine, make_session_factory
from models.settings import Settings, get_settings
from models.tables import JOB_STATUSES, Job
from storage import ObjectStore, open_store

JSON_BODY_LIMIT = 1 << 20  # every request but an upload: job specs are small
MULTIPART_SLACK = 1 << 16  # multipart framing around the file itself


class _JobsCollector:
    """`humanline_jobs{status}`: jobs per status, counted when Prometheus scrapes."""

    def __init__(self, factory: sessionmaker[Session]):
        self.factory = factory

    def collect(self):
        gauge = GaugeMetricFamily("humanline_jobs", "Jobs by status.", labels=["status"])
        counts = dict.fromkeys(JOB_STATUSES, 0)
        try:
            with self.factory() as session:
                counts.update(
                    session.execute(select(Job.status, func.count()).group_by(Job.status))
                    .tuples()
                    .all()
                )
        except Exception:  # noqa: BLE001 - a scrape must not fail because the DB blinked
            return
        for status, count in counts.items():
            gauge.add_metric([status], count)
        yield gauge


def _open_store(settings: Settings) -> ObjectStore:
    return open_store(settings.STORAGE_URL, **settings.storage_options())


def create_app(
    settings: Settings | None = None,
    *,
    store: ObjectStore | None = None,
    queue: JobQueue | None = None,
    session_factory: sessionmaker[Session] | None = None,
) -> FastAPI:
    """Build the app. Tests (and the embedded server) pass their own store, queue or
    sessions; otherwise they come from settings (STORAGE_URL, BROKER_URL, DATABASE_URL).
    The schema must exist already: `humanline-server migrate`."""
    settings = settings or get_settings()
    configure_logging(settings.LOG_LEVEL, settings.LOG_JSON)
    app = FastAPI(
        title="Humanline",
        version="0.1.0",
        summary="Fine-tuning as a service: DPO, KTO and GRPO, with humanline variants.",
    )
    factory = session_factory or make_session_factory(make_engine(
        settings.DATABASE_URL, **settings.pool_options()
    ))
    metrics = Metrics()
    metrics.registry.register(_JobsCollector(factory))
    app.state.settings = settings
    app.state.session_factory = factory
    app.state.store = store if store is not None else _open_store(settings)
    app.state.queue = queue if queue is not None else default_queue(settings)
    app.state.metrics = metrics

    def body_limit(scope: Scope) -> int:
        if scope.get("method") == "POST" and scope.get("path", "").rstrip("/") == "/v1/files":
            return settings.MAX_UPLOAD_BYTES + MULTIPART_SLACK
        return JSON_BODY_LIMIT

    install_error_handlers(app)
    app.include_router(files.router, prefix="/v1")
    app.include_router(jobs.router, prefix="/v1")
    app.include_router(evaluations.router, prefix="/v1")
    app.include_router(reports.router, prefix="/v1")
    app.include_router(health.router)
    app.add_middleware(
        RequestMiddleware, metrics=metrics, body_limit=body_limit, too_large=RequestTooLarge
    )
    return app


def tune_serving_process() -> None:
    """What a long-lived API process wants once its app is built.

    Freeze the startup heap (≈115k objects: FastAPI, SQLAlchemy, pydantic schemas) out of the
    cyclic collector: every full collection would otherwise walk all of it, a ~0.1 s pause of
    the event loop (and every request waiting on it) each time, for objects that live as long
    as the process anyway. Requests allocate and free their own objects as before.
    """
    gc.collect()
    gc.freeze()
    # A request hops between the event loop and a worker thread; each hop may wait for the
    # GIL for up to the switch interval (5 ms by default) while the other thread computes.
    sys.setswitchinterval(0.001)


def server_app() -> FastAPI:
    """The app of a serving process: `uvicorn --factory api.main:server_app`. Tests build
    their apps with create_app, which leaves the process as it found it."""
    app = create_app()
    tune_serving_process()
    return app
