"""What one attempt of a multi-node job is: its shape, the spec its ranks read, their argv
(design26 §3-§4). The ranks share no disk with the worker: everything goes through the store.

    {team}/{job}/run/attempt-{a}/spec.json    the job's spec, training_file = the URL of its
                                              published file ({team}/files/{file}.jsonl)
    python -m trainer run SPEC_URL --out /tmp/run --no-progress
        --checkpoints URL({team}/{job}/) --final URL({team}/{job}/final/)
        --runlog URL({team}/{job}/run/attempt-{a}/) [--resume]

--resume when a committed checkpoint (step-N/ with its _COMPLETE) is in the store: the
trainer resumes from the newest one itself (DCP reshards to this attempt's world size).
The ranks' store credentials are the pods' own (a Secret of the runtime, never the spec);
the worker passes only the endpoint and region it uses (AWS_ENDPOINT_URL_S3,
AWS_DEFAULT_REGION).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from contract.runs import COMPLETE_MARKER, checkpoint_step
from models.launches import TRAINJOB
from models.tables import File
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

RANK_SCRATCH = "/tmp/run"  # each rank's local --out (nothing in it outlives the pod)


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
    spec_key = run_spec_key(team_id, job_id, attempt)
    store.put_bytes(spec_key, json.dumps(doc, indent=2).encode())
    return spec_key


def trainer_args(
    store: ObjectStore, team_id: str, job_id: str, attempt: int, *, resume: bool
) -> list[str]:
    """The trainer's argv after the launcher's torchrun (module docstring)."""
    args = [
        "-m", "trainer", "run", object_url(store, run_spec_key(team_id, job_id, attempt)),
        "--out", RANK_SCRATCH, "--no-progress",
        "--checkpoints", object_url(store, job_prefix(team_id, job_id)),
        "--final", object_url(store, final_model_prefix(team_id, job_id)),
        "--runlog", object_url(store, run_prefix(team_id, job_id, attempt)),
    ]  # fmt: skip
    return [*args, "--resume"] if resume else args


def rank_env(settings: WorkerSettings) -> dict[str, str]:
    env = {
        "AWS_ENDPOINT_URL_S3": settings.S3_ENDPOINT_URL,
        "AWS_DEFAULT_REGION": settings.AWS_REGION,
    }
    return {k: v for k, v in env.items() if v}


def launch_request(
    settings: WorkerSettings, store: ObjectStore, job: Any, attempt: int, *, resume: bool
) -> LaunchRequest:
    """What the launcher starts for `attempt` of `job` (a Job row or its detached copy)."""
    nodes, per_node = shape(job.spec, job.meta)
    on_gpu = queue_for(job.base_model, job.meta, settings.cpu_models) == "gpu"
    return LaunchRequest(
        job_id=job.id,
        attempt=attempt,
        nodes=nodes,
        processes_per_node=per_node,
        args=trainer_args(store, job.team_id, job.id, attempt, resume=resume),
        env=rank_env(settings),
        gpus_per_node=per_node if on_gpu else 0,
    )


def trainjob_launcher(settings: WorkerSettings) -> Launcher:
    """The cluster's launcher (worker.launchers.trainjob, imported only when needed)."""
    from worker.launchers.trainjob import trainjob_launcher as factory

    return factory(settings)
