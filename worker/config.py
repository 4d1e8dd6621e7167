"""Worker settings: the service's one Settings class plus the knobs only workers read.

Every field is an environment variable of the same name, like models.settings.Settings.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from functools import lru_cache

from pydantic import Field, field_validator

from contract.memory import TINY_LLAMA
from models.settings import Settings
from worker.gpus import parse_worker_gpus, worker_gpu_ids


class WorkerSettings(Settings):
    WORKER_DIR: str = Field(
        "./.humanline/work",
        description="Local scratch: one run directory per job attempt (data, checkpoints).",
    )
    WORKER_GPUS: str = Field(
        "",
        description="The GPUs this worker owns (a job uses all of them unless its metadata "
        "says `gpus: N`): 'all', 'count:N', 'ids:0,1,2,3'; 'none' = CPU only, GPUs hidden; "
        "empty = one process with the worker's own devices. A bare number is refused "
        "(worker.gpus).",
    )
    WORKER_CPU_MODELS: str = Field(
        TINY_LLAMA,
        description="Base models small enough for the `cpu` queue; every other job is routed "
        "to `gpu` (worker.routing.queue_for).",
    )
    WORKER_POLL_SECONDS: float = Field(
        0.5, gt=0, description="How often the runner tails the trainer's files and uploads."
    )
    REAPER_SECONDS: float = Field(
        15.0, gt=0, description="Period of the reaper sweep in every worker process."
    )
    SWEEP_SECONDS: float = Field(
        600.0,
        ge=0,
        description="Period of the storage sweep (worker.sweeper: temporary objects, files "
        "without a row, outputs of finished jobs no row references): a thread of the "
        "embedded worker, the Celery beat entry `sweep-storage`. 0: never.",
    )
    SWEEP_GRACE_SECONDS: float = Field(
        3600.0,
        ge=60,
        description="The sweep removes only orphans last written longer ago than this: a "
        "write in flight (an upload trickling in, a checkpoint being uploaded) is younger.",
    )
    STALE_QUEUED_SECONDS: float = Field(
        600.0,
        gt=0,
        description="A job queued this long without a change gets its task sent again "
        "(a lost broker message); duplicates are harmless, claim() lets one win.",
    )
    TRAINER_PYTHON: str = Field(sys.executable, description="Interpreter for the trainer.")
    KEEP_RUN_DIRS: bool = Field(
        False, description="Keep run directories after a job ends (debugging)."
    )
    STOP_GRACE_SECONDS: float = Field(
        300.0,
        gt=0,
        description="How long a trainer asked to stop (cancel, max_runtime, shutdown) may take "
        "to reach its next step boundary and checkpoint before it is killed.",
    )
    STDERR_TAIL_BYTES: int = Field(
        4000,
        ge=100,
        description="How much of the end of a failed trainer's or evaluation's stderr is read "
        "for its error (worker.attempt.stderr_tail).",
    )

    TRAINJOB_NAMESPACE: str = Field(
        "default", description="Kubernetes namespace of multi-node TrainJobs (Kubeflow Trainer)."
    )
    TRAINJOB_RUNTIME: str = Field(
        "humanline-torch",
        description="The ClusterTrainingRuntime a TrainJob references (deploy/k8s/).",
    )
    TRAINJOB_QUEUE: str = Field(
        "", description="Kueue LocalQueue of TrainJobs; empty = no Kueue (admitted at once)."
    )
    TRAINJOB_IMAGE: str = Field(
        "", description="Trainer image of TrainJobs; empty = the runtime's image."
    )
    RECONCILE_SECONDS: float = Field(
        15.0, gt=0, description="Period of the reconcile sweep over multi-node jobs."
    )
    HANG_SECONDS: float = Field(
        1800.0,
        gt=0,
        description="A multi-node job with no new step for this long is deleted and retried.",
    )
    SUBMIT_BACKOFF_SECONDS: float = Field(
        15.0, gt=0, description="A failed TrainJob submit waits this long, doubling each time."
    )
    SUBMIT_GIVE_UP_SECONDS: float = Field(
        3600.0, gt=0, description="Submits failing this long in a row fail the job."
    )
    START_DEADLINE_SECONDS: float = Field(
        600.0,
        gt=0,
        description="An admitted TrainJob whose ranks are not all running this long after "
        "admission (no JobSet, pods never created or never scheduled) fails the attempt.",
    )
    ADMISSION_TIMEOUT_SECONDS: float = Field(
        14400.0,
        ge=0,
        description="A TrainJob suspended (not admitted by Kueue) this long fails the job; "
        "0 = wait forever.",
    )
    TRAINJOB_SWEEP_SECONDS: float = Field(
        300.0, gt=0, description="Period of the reconcile's sweep of orphaned TrainJobs."
    )
    MAX_DISRUPTIONS: int = Field(
        20, ge=0, description="Attempts ended by a disruption (drain, preemption) that are free."
    )

    @field_validator("WORKER_GPUS")
    @classmethod
    def _check_worker_gpus(cls, value: str) -> str:
        parse_worker_gpus(value)  # a worker with an ambiguous WORKER_GPUS does not start
        return value

    @property
    def gpu_ids(self) -> list[str] | None:
        """None: unset (inherit devices); []: CPU only; else the ids (worker.gpus)."""
        return worker_gpu_ids(parse_worker_gpus(self.WORKER_GPUS), self.TRAINER_PYTHON)

    @property
    def cpu_models(self) -> frozenset[str]:
        return frozenset(m.strip() for m in self.WORKER_CPU_MODELS.split(",") if m.strip())

    @property
    def heartbeat_seconds(self) -> float:
        """Renew well inside the lease whatever HEARTBEAT_SECONDS says: a lease of 5 s with
        the default 30 s heartbeat would expire between beats."""
        return max(0.2, min(self.HEARTBEAT_SECONDS, self.LEASE_SECONDS / 3))


def as_worker_settings(settings: Settings) -> WorkerSettings:
    """The API's Settings (e.g. handed to worker.embedded.start) as WorkerSettings: its
    values win, the worker-only fields come from the environment or their defaults."""
    if isinstance(settings, WorkerSettings):
        return settings
    return WorkerSettings(**settings.model_dump())


@lru_cache
def get_worker_settings() -> WorkerSettings:
    return WorkerSettings()


def new_worker_id() -> str:
    """Lease owner of one job attempt: host, pid and a random part (a restarted process
    with a recycled pid must not pass for its predecessor)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
