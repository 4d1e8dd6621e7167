"""What one attempt of a multi-node job is: its shape, the spec its ranks read, their argv
(design26 §3-§4). The ranks share no disk with the worker: everything goes through the store.

    {team}/{job}/run/attempt-{a}/spec.json    the job's spec, training_file = the URL of its
                                              published file ({team}/files/{file}.jsonl)
    python -m trainer run SPEC_URL --out /tmp/run --no-progress
        --checkpoints URL({team}/{job}/) --final URL({team}/{job}/final/)
        --runlog URL({team}/{job}/run/attempt-{a}/) --resume

--resume always: the trainer resumes from the newest committed checkpoint (step-N/ with its
_COMPLETE) in the store, and starts fresh when there is none. The same argv then serves a
first attempt, a retry, and pods Kueue re-admits after a preemption (they rerun the
TrainJob's original argv, which must not restart from step 0 over recorded steps).
DCP reshards to this attempt's world size. A multi-node spec without checkpoints
(checkpoint_every 0) gets DEFAULT_CHECKPOINT_EVERY in its spec.json: else every retry
restarts from step 0. --out is on the pod's /scratch volume (the runtime's emptyDir), not
the container's overlay.
The ranks' store credentials are the pods' own (a Secret of the runtime, never the spec);
the worker passes only the endpoint and region it uses (AWS_ENDPOINT_URL_S3,
AWS_DEFAULT_REGION).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from contract.runs import COMPLETE_MARKER, checkpoint_step
from models.launches import TRAINJOB
from models.tables import File, JobEvent
from storage import IncompleteCheckpointError, ObjectStore, object_url
from storage.keys import (
    checkpoint_prefix,
    final_model_prefix,
    job_prefix,
    run_prefix,
    run_spec_key,
)
from worker.attempt import AttemptFailed
from worker.launchers.base import LaunchRequest
from worker.routing import queue_for

if TYPE_CHECKING:
    from worker.config import WorkerSettings
    from worker.launchers.base import Launcher

RANK_SCRATCH = "/scratch/run"  # each rank's local --out (nothing in it outlives the pod)
DEFAULT_CHECKPOINT_EVERY = 100  # steps, or a tenth of max_steps when that is fewer
MEMORY_MARGIN = 1.25  # the estimate is calibrated to +-25%


def nodes_of(spec: dict[str, Any]) -> int:
    return int((spec.get("parallelism") or {}).get("nodes") or 1)


def is_multinode(launcher: str | None, spec: dict[str, Any]) -> bool:
    """Launched on the cluster: decided at the first launch (parallelism.nodes > 1), kept."""
    return launcher == TRAINJOB or nodes_of(spec) > 1


def shape(spec: dict[str, Any], meta: dict[str, Any]) -> tuple[int, int]:
    """(nodes, processes per node): processes_per_node, else the metadata's `gpus`, else 1."""
    par = spec.get("parallelism") or {}
    per_node = par.get("processes_per_node") or (meta or {}).get("gpus") or 1
    return nodes_of(spec), int(per_node)


def committed_checkpoints(
    store: ObjectStore,
    team_id: str,
    job_id: str,
    recorded: frozenset[int] | set[int] = frozenset(),
) -> dict[int, tuple[str, list[str], int]]:
    """step → (prefix, files, bytes) of every committed checkpoint of the job in the store
    (a step-N/ whose _COMPLETE manifest is there; torn ones are not listed). The manifest of a
    step already `recorded` as a checkpoint row is not read again (its files are not needed):
    a reconcile tick reads only the new checkpoints' manifests."""
    base = job_prefix(team_id, job_id)
    found: dict[int, tuple[str, list[str], int]] = {}
    for key in store.list(base):
        head, _, name = key[len(base) :].partition("/")
        step = checkpoint_step(head)
        if step is None or name != COMPLETE_MARKER:
            continue
        prefix = checkpoint_prefix(team_id, job_id, step)
        if step in recorded:
            found[step] = (prefix, [], 0)
            continue
        try:
            entries = store.read_manifest(prefix)  # type: ignore[attr-defined]
        except IncompleteCheckpointError:
            continue
        found[step] = (prefix, [p for p, _ in entries], sum(n for _, n in entries))
    return found


def write_spec(
    sessions: Any, store: ObjectStore, job_id: str, team_id: str, attempt: int, spec: dict,
    training_file_id: str | None,
) -> str:  # fmt: skip
    """The attempt's spec.json in the store (training_file: its published file's URL)."""
    with sessions() as s:
        row = s.get(File, training_file_id) if training_file_id else None
        key = row.object_key if row is not None else None
    if key is None or not store.exists(key):
        raise AttemptFailed("the job's training file was deleted", "missing_file")
    doc = {**spec, "training_file": object_url(store, key)}
    if not doc.get("checkpoint_every"):
        max_steps = doc.get("max_steps") or 10 * DEFAULT_CHECKPOINT_EVERY
        doc["checkpoint_every"] = max(1, min(DEFAULT_CHECKPOINT_EVERY, max_steps // 10))
    spec_key = run_spec_key(team_id, job_id, attempt)
    store.put_bytes(spec_key, json.dumps(doc, indent=2).encode())
    return spec_key


def trainer_args(store: ObjectStore, team_id: str, job_id: str, attempt: int) -> list[str]:
    """The trainer's argv after the launcher's torchrun (module docstring)."""
    args = [
        "-m", "trainer", "run", object_url(store, run_spec_key(team_id, job_id, attempt)),
        "--out", RANK_SCRATCH, "--no-progress",
        "--checkpoints", object_url(store, job_prefix(team_id, job_id)),
        "--final", object_url(store, final_model_prefix(team_id, job_id)),
        "--runlog", object_url(store, run_prefix(team_id, job_id, attempt)), "--resume",
    ]  # fmt: skip
    return args


def rank_env(settings: WorkerSettings) -> dict[str, str]:
    env = {
        "AWS_ENDPOINT_URL_S3": settings.S3_ENDPOINT_URL,
        "AWS_DEFAULT_REGION": settings.AWS_REGION,
    }
    return {k: v for k, v in env.items() if v}


def node_requests(estimate: dict[str, Any] | None, per_node: int, on_gpu: bool) -> dict[str, str]:
    """A node's CPU and memory requests: a core per process; on CPU, memory from the job's
    estimate (memory_gib_per_process, with its margin). A GPU job's estimate is of GPU
    memory, so its host memory is left to the runtime."""
    requests = {"cpu": str(per_node)}
    gib = (estimate or {}).get("memory_gib_per_process")
    if not on_gpu and isinstance(gib, (int, float)) and gib > 0:
        requests["memory"] = f"{max(1, round(gib * per_node * MEMORY_MARGIN))}Gi"
    return requests


def launch_request(
    settings: WorkerSettings, store: ObjectStore, job: Any, attempt: int,
    estimate: dict[str, Any] | None = None,
) -> LaunchRequest:  # fmt: skip
    """What the launcher starts for `attempt` of `job` (a Job row or its detached copy);
    `estimate`: the API's (the job's `created` event)."""
    nodes, per_node = shape(job.spec, job.meta)
    on_gpu = queue_for(job.base_model, job.meta, settings.cpu_models) == "gpu"
    return LaunchRequest(
        job_id=job.id,
        attempt=attempt,
        nodes=nodes,
        processes_per_node=per_node,
        args=trainer_args(store, job.team_id, job.id, attempt),
        env=rank_env(settings),
        gpus_per_node=per_node if on_gpu else 0,
        requests=node_requests(estimate, per_node, on_gpu),
    )


def job_estimate(sessions: Any, job_id: str) -> dict[str, Any] | None:
    """The API's estimate of the job (its `created` event's data), None without one."""
    with sessions() as s:
        data = s.execute(
            select(JobEvent.data).where(JobEvent.job_id == job_id, JobEvent.kind == "created")
        ).scalar()
    estimate = (data or {}).get("estimate")
    return estimate if isinstance(estimate, dict) else None


def trainjob_launcher(settings: WorkerSettings) -> Launcher:
    """The cluster's launcher (worker.launchers.trainjob, imported only when needed)."""
    from worker.launchers.trainjob import trainjob_launcher as factory

    return factory(settings)
