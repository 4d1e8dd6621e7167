"""The one settings class of the service (API, worker and CLIs read it).

Every field is an environment variable of the same name (no prefix). The defaults are the
embedded single-machine setup of DESIGN.md §5: SQLite, an in-process worker and a local
object store under ./.humanline, so `humanline-server serve` needs no external service.
Production sets DATABASE_URL (PostgreSQL), BROKER_URL (Redis/RabbitMQ) and STORAGE_URL (s3://).
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contract.evaluation import OPENAI_JUDGE_DEFAULTS as _JUDGE
from contract.evaluation import judge_url
from contract.memory import SMOLLM2, TINY_LLAMA
from contract.spec import INT4_MAX  # PostgreSQL integer: step counts are stored in such columns

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
    TEAM_STORAGE_QUOTA_GIB: float = Field(
        100.0, gt=0,
        description="Bytes one team may keep stored: its files, checkpoints and exported models "
        "(as the database records them). An upload that would go over it is refused (413).",
    )
    ALLOWED_BASE_MODELS: str = Field(
        f"{SMOLLM2},{TINY_LLAMA}",
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

    # --- scheduling across teams (DESIGN.md §6; models.scheduling) ----------------------------
    TEAM_MAX_RUNNING: int = Field(
        4,
        ge=0,
        description="Jobs of one team running at once, over all workers; checked when a worker "
        "claims a job (the database decides, not the broker). 0: no limit.",
    )
    MAX_RUNTIME_SECONDS: float = Field(
        24 * 3600.0,
        gt=0,
        description="A job's wall-clock limit (all attempts together) when its spec sets no "
        "max_runtime; past it the job checkpoints and fails.",
    )
    CAP_MAX_RUNTIME_SECONDS: float = Field(
        7 * 24 * 3600.0,
        gt=0,
        description="The largest max_runtime a spec may ask for (422 above it); workers also "
        "hold every job to it.",
    )

    # --- spec caps (DESIGN.md §6): the most one job may ask for; api.caps checks them -------
    CAP_ADAPTER_R: int = Field(256, ge=1, le=INT4_MAX, description="Largest LoRA rank.")
    CAP_STEPS: int = Field(
        100_000, ge=1, le=INT4_MAX,
        description="Most optimizer steps of one job: max_steps, or epochs × batches per epoch.",
    )
    CAP_EPOCHS: int = Field(100, ge=1, le=INT4_MAX)
    CAP_MAX_LENGTH: int = Field(8192, ge=2, le=INT4_MAX, description="Prompt + completion tokens.")
    CAP_MAX_PROMPT_LENGTH: int = Field(8191, ge=1, le=INT4_MAX)
    CAP_BATCH_SIZE: int = Field(1024, ge=1, le=INT4_MAX, description="Global batch, any unit.")
    CAP_GRAD_ACCUM: int = Field(256, ge=1, le=INT4_MAX)
    CAP_NUM_SAMPLES: int = Field(64, ge=2, le=INT4_MAX, description="online.num_samples (G).")
    CAP_MAX_NEW_TOKENS: int = Field(4096, ge=1, le=INT4_MAX, description="online.max_new_tokens.")
    CAP_PROMPT_BUDGET: float = Field(16.0, ge=1, description="online.prompt_budget.")
    CAP_ONLINE_LAG: int = Field(
        4, ge=0, le=16, description="online.lag: how stale async samples may be (steps)."
    )
    ONLINE_ASYNC: bool = Field(
        True,
        description="Whether workers can place an async sampler process beside the trainer "
        "(online.mode 'async'); False refuses such jobs (422).",
    )
    CAP_MAX_MODEL_LEN: int = Field(
        16384, ge=16, le=INT4_MAX, description="online.vllm.max_model_len."
    )
    CAP_KV_CACHE_GIB: float = Field(64.0, gt=0, description="online.vllm.kv_cache_gib.")
    CAP_QUALITY_SAMPLE: int = Field(4096, ge=0, le=INT4_MAX, description="quality_sample.")
    CAP_REWARD_TIMEOUT_SECONDS: float = Field(
        60.0, gt=0, description="A reward's timeout_s / start_timeout_s option."
    )
    CAP_TARGET_MODULES: int = Field(64, ge=1, description="adapter.target_modules entries.")
    CAP_TRAIN_MEMORY_GIB: float = Field(
        512.0, gt=0,
        description="Most memory one training process of a job may need, as estimated from the "
        "base model's config.json, the adapter, precision, max_length, batch size and objective "
        "(contract.memory): host RAM on CPU workers, device memory on GPUs. With grad_accum "
        "unset the trainer picks the micro-batch, so a job is refused only when one example "
        "per micro-batch (checkpointed) cannot fit within the cap less 10 % (the instruction "
        "preset's DPO on SmolLM2 at max_length 1024 estimates ~75 GiB as one micro-batch of "
        "32 pairs, ~3.8 GiB at one pair, checkpointed); a set grad_accum is priced as given. "
        "The default refuses only what no worker could run; set it to the workers' memory.",
    )
    # Several nodes per job (issue 26, docs/deploy.md): parallelism.nodes > 1.
    MULTINODE_LAUNCHER: Literal["none", "trainjob"] = Field(
        "none",
        description="How a job with parallelism.nodes > 1 runs: 'trainjob' (a Kubeflow Trainer "
        "TrainJob, deploy/k8s/); 'none' refuses such jobs (422).",
    )
    MAX_NODES: int = Field(8, ge=1, le=1024, description="parallelism.nodes.")
    MAX_PROCESSES_PER_NODE: int = Field(
        8, ge=1, le=64, description="parallelism.processes_per_node."
    )
    # The cost estimate (contract.estimate, POST /v1/jobs/estimate): what the job queue runs on.
    JOB_DEVICE_KIND: Literal["cpu", "h100", "h200"] = Field(
        "cpu",
        description="The device class of the workers CELERY_QUEUE feeds, a row of "
        "contract/throughput.json: its memory (at most CAP_TRAIN_MEMORY_GIB) and throughput "
        "price a job's estimate.",
    )
    JOB_PROCESSES: int = Field(
        1, ge=1, le=64, description="Training processes (GPUs on a GPU queue) a job runs on."
    )
    JOB_MEMORY_GIB: float | None = Field(
        None,
        gt=0,
        description="Memory one training process has on the workers CELERY_QUEUE feeds (a "
        "GPU's memory, or a CPU worker's RAM per process): the estimate chooses its micro-batch "
        "for it, as the trainer will there. Unset: the device class's (contract/throughput.json)"
        ", and on a CPU queue this machine's memory ÷ JOB_PROCESSES (the embedded worker's). "
        "Never above CAP_TRAIN_MEMORY_GIB, the most any job may ask for.",
    )

    # --- evaluations (DESIGN.md §9) -------------------------------------------------------------
    MAX_EVALS_PER_TEAM: int = Field(10, ge=1, description="Queued or running evaluations per team.")
    EVAL_JUDGE_BASE_URLS: str = Field(
        "",
        description="Comma-separated OpenAI-compatible endpoints an instruction evaluation's "
        "judge may name (users can never name another).",
    )
    EVAL_JUDGE_API_KEY: str = Field(
        "", repr=False, description="The server's key for those judges; never stored or returned."
    )
    EVAL_REWARD_MODELS: str = Field(
        "",
        description="name=/dir pairs, comma-separated: the reward models a judge may name "
        "(mounted on the workers).",
    )
    EVAL_JUDGE_TIMEOUT_SECONDS: float = Field(
        _JUDGE.timeout, gt=0, description="One judge request."
    )
    EVAL_JUDGE_DEADLINE_SECONDS: float = Field(
        _JUDGE.deadline, gt=0, description="All retries of one judge request together."
    )
    EVAL_JUDGE_MAX_ATTEMPTS: int = Field(_JUDGE.max_attempts, ge=1)
    EVAL_JUDGE_CONCURRENCY: int = Field(
        _JUDGE.concurrency, ge=1, description="Judge requests in flight at once."
    )
    EVAL_SAMPLING_ENGINE: str = Field("hf", description="hf, vllm or auto (trainer.sampling).")
    EVAL_WARM_START: bool = Field(
        False,
        description="Fork evaluations from a warm process that has imported torch and "
        "transformers (worker.warm) instead of starting a fresh interpreter: about 6 s less "
        "per evaluation, for many small ones (benchmarks/testbed.py). The worker must run "
        "the trainer's interpreter (TRAINER_PYTHON); other launches start cold.",
    )
    EVAL_TIMEOUT_SECONDS: float = Field(
        6 * 3600.0, gt=0, description="An evaluation still running after this is killed."
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
    PRESIGN_SECONDS: int = Field(
        300,
        ge=1,
        le=7 * 24 * 3600,  # SigV4's limit
        description="Lifetime of presigned checkpoint and model download URLs (S3). A link "
        "handed out works this long whatever happens to the key that asked for it: it outlives "
        "a revoked key by at most this much.",
    )
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
    TRUSTED_PROXIES: str = Field(
        "",
        description="Comma-separated IPs/CIDRs of the ingress: only a request whose socket peer "
        "is one of them has its X-Forwarded-For read (the rightmost untrusted address is the "
        "client the failed-login limiter keys on). Empty: the peer is the client.",
    )
    # --- long-lived requests (DESIGN.md §6; api/limits.py): per API process -----------------
    UPLOAD_MAX_CONCURRENT: int = Field(
        32, ge=1, description="Uploads in progress at once in one API process; more: 503 "
        "with Retry-After. Each holds a socket, up to ~5 MiB of read-ahead and, while bytes "
        "arrive, a worker thread of its own (never one of the request pool's)."
    )
    UPLOAD_MAX_PER_TEAM: int = Field(
        8, ge=1, description="Uploads in progress at once per team, per API process; more: 429 "
        "with Retry-After."
    )
    UPLOAD_IDLE_TIMEOUT_S: float = Field(
        30.0, gt=0, description="An upload whose client sends no byte for this long is "
        "answered 408 and nothing of it is kept (no object, no temporary file, no row)."
    )
    STREAMS_PER_TEAM: int = Field(
        20, ge=1, description="Open event streams (GET /v1/jobs/{id}/events/stream) per team, "
        "per API process; more: 429 with Retry-After."
    )
    STREAMS_TOTAL: int = Field(
        100, ge=1, description="Open event streams in one API process; more: 503 with "
        "Retry-After. Each polls the database every SSE_POLL_SECONDS."
    )

    # --- Prometheus metrics (docs/deploy.md) ----------------------------------------------------
    METRICS_PORT: int = Field(
        0, ge=0, le=65535, description="Serve /metrics on this port, on its own listener "
        "(METRICS_HOST), apart from the API's; 0: no separate listener."
    )
    METRICS_HOST: str = Field("127.0.0.1", description="Address of the METRICS_PORT listener.")
    METRICS_ON_API_PORT: bool = Field(
        False, description="Also serve /metrics, unauthenticated, on the API's own port (only "
        "behind an ingress that does not route it); off by default."
    )

    # --- webhooks (models.webhooks, worker.webhooks, docs/webhooks.md) ----------------------
    WEBHOOKS_ALLOW_PRIVATE: bool = Field(
        False, description="Let webhook URLs resolve to loopback, link-local, private or other "
        "non-public addresses (SSRF guard off). Off by default.",
    )
    WEBHOOKS_ALLOWED_CIDRS: str = Field(
        "", description="Comma-separated CIDRs webhook URLs may resolve to although they are not "
        "public (e.g. '10.1.0.0/16'); checked at create and again at each delivery.",
    )
    WEBHOOKS_ALLOW_HTTP: bool | None = Field(
        None, description="Accept http:// webhook URLs. None: only with the embedded worker "
        "(BROKER_URL=memory://); production requires https.",
    )
    WEBHOOK_TIMEOUT_SECONDS: float = Field(
        10.0, gt=0, le=300, description="One delivery attempt, all of it (DNS, connect, TLS, "
        "request, response headers): a deadline, not a per-read timeout.",
    )
    WEBHOOK_DNS_TIMEOUT_SECONDS: float = Field(
        2.0, gt=0, le=30, description="A webhook host's DNS lookup, at create and at delivery."
    )
    WEBHOOK_SENDERS_PER_TEAM: int = Field(
        2, ge=1, description="Endpoints of one team being sent to at once (all workers)."
    )
    WEBHOOK_SENDERS: int = Field(
        8, ge=1, description="Endpoints the embedded worker sends to at once (under Celery: "
        "the concurrency of the workers on the webhook queue).",
    )
    WEBHOOK_CREATES_PER_TEAM: int = Field(
        2, ge=1, description="Webhook creates of one team in progress at once (their URL's "
        "lookup); more: 429.",
    )
    WEBHOOK_CREATES: int = Field(
        16, ge=1, description="Webhook creates in progress in one API process; more: 503."
    )
    WEBHOOK_MAX_ATTEMPTS: int = Field(
        8, ge=1, description="Attempts of one delivery before it is marked failed."
    )
    WEBHOOK_BACKOFF_SECONDS: float = Field(
        5.0, ge=0, description="Wait before the 2nd attempt; doubled after each failure."
    )
    WEBHOOK_BACKOFF_MAX_SECONDS: float = Field(3600.0, ge=0, description="Cap of that wait.")
    WEBHOOK_DISABLE_AFTER: int = Field(
        5, ge=1, description="Consecutive failed deliveries (every attempt failed) after which "
        "an endpoint is disabled.",
    )

    LOG_LEVEL: str = "INFO"
    LOG_JSON: bool = True

    @model_validator(mode="after")
    def _runtime_default_within_cap(self) -> Settings:
        if self.MAX_RUNTIME_SECONDS > self.CAP_MAX_RUNTIME_SECONDS:
            raise ValueError("MAX_RUNTIME_SECONDS is above CAP_MAX_RUNTIME_SECONDS")
        return self

    def max_runtime(self, asked: float | None) -> float:
        """The wall-clock limit of a job whose spec asks for `asked` seconds (None: the
        default), never above the cap."""
        return min(asked or self.MAX_RUNTIME_SECONDS, self.CAP_MAX_RUNTIME_SECONDS)

    @property
    def embedded_worker(self) -> bool:
        """True when jobs run in the API process (no broker)."""
        return self.BROKER_URL.startswith("memory://")

    @property
    def webhooks_allow_http(self) -> bool:
        allow = self.WEBHOOKS_ALLOW_HTTP
        return self.embedded_worker if allow is None else allow

    @property
    def webhooks_allowed_cidrs(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        nets = (n.strip() for n in self.WEBHOOKS_ALLOWED_CIDRS.split(","))
        return tuple(ipaddress.ip_network(n, strict=False) for n in nets if n)

    @property
    def trusted_proxies(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        nets = (n.strip() for n in self.TRUSTED_PROXIES.split(","))
        return tuple(ipaddress.ip_network(n, strict=False) for n in nets if n)

    @property
    def allowed_base_models(self) -> tuple[str, ...]:
        return tuple(m.strip() for m in self.ALLOWED_BASE_MODELS.split(",") if m.strip())

    @property
    def allowed_reward_models(self) -> tuple[str, ...]:
        return tuple(m.strip() for m in self.ALLOWED_REWARD_MODELS.split(",") if m.strip())

    @property
    def judge_base_urls(self) -> frozenset[str]:
        """EVAL_JUDGE_BASE_URLS as a set, trailing slashes dropped."""
        urls = (judge_url(u) for u in self.EVAL_JUDGE_BASE_URLS.split(","))
        return frozenset(u for u in urls if u)

    @property
    def judge_reward_models(self) -> dict[str, str]:
        """EVAL_REWARD_MODELS="armo=/models/armo,x=/models/x": names users may pick → dirs."""
        out = {}
        for entry in self.EVAL_REWARD_MODELS.split(","):
            name, sep, path = entry.partition("=")
            if sep and name.strip() and path.strip():
                out[name.strip()] = path.strip()
        return out

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
