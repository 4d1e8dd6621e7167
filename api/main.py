"""The FastAPI application: `create_app(settings)` wires settings, DB, store, queue, routes.

uvicorn --factory api.main:server_app     # or: humanline-server serve [--workers N]
"""

from __future__ import annotations

import gc
import logging
import sys
from typing import Any

from fastapi import FastAPI
from prometheus_client import start_http_server
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import Scope

from api.errors import RequestTooLarge, install_error_handlers
from api.limits import SlotLimiter, stream_limiter, upload_limiter
from api.observability import Metrics, RequestMiddleware, configure_logging
from api.queues import WorkQueue, default_queue
from api.routes import evaluations, files, fine_tuning, health, jobs, reports, webhooks
from contract.tasks import DELIVER_WEBHOOKS, RUN_EVALUATION, RUN_JOB
from models import webhooks as webhook_outbox
from models.db import make_engine, make_session_factory
from models.settings import Settings, get_settings
from models.tables import JOB_STATUSES, Job
from storage import ObjectStore, open_store

JSON_BODY_LIMIT = 1 << 20  # every request but an upload: job specs are small
MULTIPART_SLACK = 1 << 16  # multipart framing around the file itself
log = logging.getLogger("humanline.api")


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


class _SlotsCollector:
    """`humanline_uploads_in_progress` and `humanline_event_streams_open` (api.limits), per
    process: how close it is to UPLOAD_MAX_CONCURRENT and STREAMS_TOTAL."""

    def __init__(self, uploads: SlotLimiter, streams: SlotLimiter):
        self.uploads, self.streams = uploads, streams

    def collect(self):
        for name, limiter, doc in (
            ("humanline_uploads_in_progress", self.uploads, "Uploads being received."),
            ("humanline_event_streams_open", self.streams, "Open event streams."),
        ):
            yield GaugeMetricFamily(name, doc, value=limiter.in_use())


def _open_store(settings: Settings) -> ObjectStore:
    return open_store(settings.STORAGE_URL, **settings.storage_options())


def create_app(
    settings: Settings | None = None,
    *,
    store: ObjectStore | None = None,
    queue: WorkQueue | None = None,
    eval_queue: WorkQueue | None = None,
    session_factory: sessionmaker[Session] | None = None,
) -> FastAPI:
    """Build the app. Tests (and the embedded server) pass their own store, queues or
    sessions; otherwise they come from settings (STORAGE_URL, BROKER_URL, DATABASE_URL).
    The schema must exist already: `humanline-server migrate`."""
    settings = settings or get_settings()
    configure_logging(settings.LOG_LEVEL, settings.LOG_JSON)
    app = FastAPI(
        title="Humanline",
        version="0.1.0",
        summary="Fine-tuning as a service: SFT, and DPO, KTO and GRPO with humanline variants.",
    )
    factory = session_factory or make_session_factory(make_engine(
        settings.DATABASE_URL, **settings.pool_options()
    ))
    metrics = Metrics()
    metrics.registry.register(_JobsCollector(factory))
    app.state.settings = settings
    app.state.session_factory = factory
    app.state.store = store if store is not None else _open_store(settings)
    app.state.queue = queue if queue is not None else default_queue(settings, RUN_JOB)
    app.state.eval_queue = (
        eval_queue if eval_queue is not None else default_queue(settings, RUN_EVALUATION)
    )
    app.state.metrics = metrics
    if queue is None and not settings.embedded_worker:  # webhooks of the API's own commits
        webhook_outbox.set_sender(default_queue(settings, DELIVER_WEBHOOKS).enqueue)
    metrics.registry.register(_SlotsCollector(upload_limiter(app.state), stream_limiter(app.state)))

    def body_limit(scope: Scope) -> int:
        if scope.get("method") == "POST" and scope.get("path", "").rstrip("/") == "/v1/files":
            return settings.MAX_UPLOAD_BYTES + MULTIPART_SLACK
        return JSON_BODY_LIMIT

    install_error_handlers(app)
    app.include_router(files.router, prefix="/v1")
    app.include_router(jobs.router, prefix="/v1")
    app.include_router(evaluations.router, prefix="/v1")
    app.include_router(reports.router, prefix="/v1")
    app.include_router(webhooks.router, prefix="/v1")
    app.include_router(fine_tuning.router, prefix="/v1")
    app.include_router(health.router)
    if settings.METRICS_ON_API_PORT:
        app.include_router(health.metrics_router)
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


def serve_metrics(app: FastAPI) -> Any | None:
    """With METRICS_PORT set, serve the app's Prometheus metrics on their own listener
    (METRICS_HOST:METRICS_PORT, any path), in a thread: scrapes reach neither the teams' port
    nor its event loop. Returns the server (its `shutdown()` stops it), or None."""
    settings: Settings = app.state.settings
    if not settings.METRICS_PORT:
        return None
    try:
        server, _ = start_http_server(
            settings.METRICS_PORT, addr=settings.METRICS_HOST, registry=app.state.metrics.registry
        )
    except OSError as exc:  # another process of this server has it (uvicorn --workers N)
        log.error(
            "metrics not served: cannot listen on %s:%s (%s); with several API processes per "
            "host give each its own METRICS_PORT",
            settings.METRICS_HOST, settings.METRICS_PORT, exc,
        )  # fmt: skip
        return None
    return server


def server_app() -> FastAPI:
    """The app of a serving process: `uvicorn --factory api.main:server_app`. Tests build
    their apps with create_app, which leaves the process as it found it."""
    app = create_app()
    serve_metrics(app)
    tune_serving_process()
    return app
