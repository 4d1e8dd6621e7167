"""The one settings class of the service (API, worker and CLIs read it).

Every field is an environment variable of the same name (no prefix). The defaults are the
embedded single-machine setup of DESIGN.md §5: SQLite, an in-process worker and a local
object store under ./.humanline, so `humanline-server serve` needs no external service.
Production sets DATABASE_URL (PostgreSQL), BROKER_URL (Redis/RabbitMQ) and STORAGE_URL (s3://).
"""

from __future__ import annotations

import os

from functools import lru_cache
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

GiB = 1 << 30
MiB = 1 << 20


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", case_sensitive=True)

    # --- services ------------------------------------------------------------------------
    DATABASE_URL: str = Field(
        "sqlite:///./.humanline/humanline.db",
        description="SQLAlchemy URL; postgresql:// URLs use psycopg 3.",
    )
    BROKER_URL: str = Field(
        "memory://",
        description="Celery broker URL; memory:// runs jobs in an embedded in-process worker.",
    )
    CELERY_QUEUE: str | None = Field(
        None, description="Queue the API sends run_job to; None = Celery's default routing."
    )
    STORAGE_URL: str = Field(
        "file://./.humanline/objects", description="file://DIR or s3://BUCKET[/prefix]."
    )
    S3_ENDPOINT_URL: str | None = None
    AWS_ACCESS_KEY_ID: str | None = None
    AWS_SECRET_ACCESS_KEY: str | None = Field(None, repr=False)
    AWS_REGION: str | None = None

    # --- limits (DESIGN.md §6) ---------------------------------------------------------------
    MAX_UPLOAD_BYTES: int = Field(GiB, ge=1, description="Largest accepted upload.")
    MAX_LINE_BYTES: int = Field(
        MiB, ge=1, description="Longest JSONL line; the data module caps it at 1 MiB anyway."
    )
    MAX_JOBS_PER_TEAM: int = Field(
        10, ge=1, description="Active (validating/queued/running/cancelling) jobs per team."
    )
    MAX_METADATA_KEYS: int = Field(16, ge=0)
    ALLOWED_BASE_MODELS: str = Field(
        "smollm2-135m-instruct,tiny-llama",
        description="Comma-separated base_model values jobs submitted over HTTP may name "
        "(operators add mounted model directories here; users can never name a path).",
    )
    ALLOWED_REWARD_MODELS: str = Field(
        "",
        description="Comma-separated reward-model directories online jobs may name "
        "(mounted on the workers; users can never name another path).",
    )
    MAX_JOB_ATTEMPTS: int = Field(
        5, ge=1, description="A job whose worker is lost this many times fails (reaper)."
    )

    # --- worker leases ----------------------------------------------------------------------
    LEASE_SECONDS: float = Field(
        120.0, gt=0, description="A claimed job is the worker's until now + LEASE_SECONDS."
    )
    HEARTBEAT_SECONDS: float = Field(
        30.0, gt=0, description="How often a worker renews its lease (well below the lease)."
    )

    # --- HTTP ---------------------------------------------------------------------------------
    HOST: str = "127.0.0.1"
    PORT: int = 8000
    SSE_POLL_SECONDS: float = Field(1.0, gt=0, description="DB poll period of event streams.")
    SSE_KEEPALIVE_SECONDS: float = Field(15.0, gt=0)
    PRESIGN_SECONDS: int = Field(3600, ge=1, description="Lifetime of checkpoint download URLs.")
    DB_POOL_SIZE: int = Field(
        12, ge=1, description="Database connections an API process keeps open. Under load all "
        "stay busy: connections beyond the pool (DB_MAX_OVERFLOW) are opened and closed per "
        "use, and a PostgreSQL connection costs a backend process to start."
    )
    DB_MAX_OVERFLOW: int = Field(4, ge=0)
    AUTH_CACHE_SECONDS: float = Field(
        5.0, ge=0, description="How long a verified API key is trusted without a DB lookup "
        "(a revoked key keeps working this long on each API process); 0: look up every request."
    )
    LOG_LEVEL: str = "INFO"
    LOG_JSON: bool = True

    @property
    def embedded_worker(self) -> bool:
        """True when jobs run in the API process (no broker)."""
        return self.BROKER_URL.startswith("memory://")

    @property
    def allowed_base_models(self) -> tuple[str, ...]:
        return tuple(m.strip() for m in self.ALLOWED_BASE_MODELS.split(",") if m.strip())

    @property
    def allowed_reward_models(self) -> tuple[str, ...]:
        return tuple(m.strip() for m in self.ALLOWED_REWARD_MODELS.split(",") if m.strip())

    def pool_options(self) -> dict[str, Any]:
        """Keyword arguments for models.db.make_engine (SQLite keeps SQLAlchemy's own pool)."""
        if self.DATABASE_URL.startswith("sqlite"):
            return {}
        return {"pool_size": self.DB_POOL_SIZE, "max_overflow": self.DB_MAX_OVERFLOW}

    def storage_options(self) -> dict[str, Any]:
        """Keyword arguments for storage.open_store (S3 only; ignored by the local store)."""
        opts = {
            "endpoint_url": self.S3_ENDPOINT_URL,
            "aws_access_key_id": self.AWS_ACCESS_KEY_ID,
            "aws_secret_access_key": self.AWS_SECRET_ACCESS_KEY,
            "region_name": self.AWS_REGION,
        }
        return {k: v for k, v in opts.items() if v is not None}


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read from the environment once."""
    return Settings()


def setting(settings: Any, name: str, default: Any) -> Any:
    """A setting that is not (yet) a field of Settings: the attribute if present, else the
    environment variable, else `default`; coerced to the default's type. (The evaluation
    knobs, EVAL_*, are read this way by the API and the worker alike.)"""
    value = getattr(settings, name, None)
    if value is None:
        value = os.environ.get(name)
    if value is None or value == "":
        return default
    if default is not None and not isinstance(value, type(default)):
        return type(default)(value)
    return value
