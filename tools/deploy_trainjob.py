"""Checks of deploy/k8s/trainjob.yaml (issue 26): the ClusterTrainingRuntime multi-node jobs
run on and the worker's RBAC. Part of tools/deploy_check (`all_problems`); the runtime is also
validated against Kubeflow Trainer's published API types in tests/deploy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]

PATH = "deploy/k8s/trainjob.yaml"
RUNTIME_NAME = "humanline-torch"  # worker.config TRAINJOB_RUNTIME's default
FLIGHT_RECORDER = (
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_NCCL_ENABLE_MONITORING",
)
# (apiGroup, resource) → verbs the worker needs (worker/launchers/trainjob.py, reconcile)
NEEDED = {
    ("trainer.kubeflow.org", "trainjobs"): {"create", "get", "list", "watch", "delete"},
    ("", "pods"): {"get", "list"},
    ("", "pods/log"): {"get"},
    ("", "events"): {"get", "list"},  # a JobSet or pod that cannot be created: only an Event
    ("kueue.x-k8s.io", "workloads"): {"get", "list"},  # why a TrainJob is not admitted
}
WORKER_ACCOUNT = "humanline-worker"


def load(root: Path = ROOT, text: str | None = None) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((root / PATH).read_text() if text is None else text) if d]


def check_trainjob(
    images: dict[str, tuple[str, str | None]], root: Path = ROOT, text: str | None = None
) -> list[str]:
    """Problems of the runtime and RBAC; `images`: image → (dockerfile, target), what
    tools.deploy_check.built_images reads from the Dockerfiles (it calls this one)."""
    docs = load(root, text)
    runtimes = [d for d in docs if d.get("kind") == "ClusterTrainingRuntime"]
    if [r["metadata"]["name"] for r in runtimes] != [RUNTIME_NAME]:
        return [f"{PATH}: needs one ClusterTrainingRuntime named {RUNTIME_NAME}"]
    spec = runtimes[0]["spec"]
    problems = []
    if "torch" not in (spec.get("mlPolicy") or {}):
        problems.append(f"{PATH}: mlPolicy.torch is missing (no PET_* env for torchrun)")
    jobset = spec["template"]["spec"]
    if (jobset.get("failurePolicy") or {}).get("maxRestarts") != 0:
        problems.append(f"{PATH}: failurePolicy.maxRestarts must be 0 (the DB owns retries)")
    nodes = [r for r in jobset.get("replicatedJobs", []) if r.get("name") == "node"]
    if not nodes:
        return [*problems, f"{PATH}: no replicatedJob named 'node' (Trainer's torch plugin)"]
    pod = nodes[0]["template"]["spec"]["template"]["spec"]
    node = next((c for c in pod.get("containers", []) if c.get("name") == "node"), None)
    if node is None:
        return [*problems, f"{PATH}: no container named 'node' (Trainer's torch plugin)"]
    image = images.get(node["image"])
    if image is None:
        problems.append(f"{PATH}: image {node['image']} is built by no Dockerfile line")
    elif image[1] == "cpu":
        problems.append(f"{PATH}: the node container runs the CPU image")
    if pod.get("automountServiceAccountToken") is not False:
        problems.append(f"{PATH}: the node pods must set automountServiceAccountToken: false")
    env = {e["name"] for e in node.get("env", [])}
    problems += [
        f"{PATH}: node env lacks {n} (flight recorder)" for n in FLIGHT_RECORDER if n not in env
    ]
    granted: dict[tuple[str, str], set[str]] = {}
    for role in (d for d in docs if d.get("kind") == "Role"):
        for rule in role.get("rules", []):
            for group in rule.get("apiGroups", []):
                for res in rule.get("resources", []):
                    granted.setdefault((group, res), set()).update(rule.get("verbs", []))
    for (group, res), verbs in NEEDED.items():
        missing = verbs - granted.get((group, res), set())
        if missing:
            problems.append(f"{PATH}: the worker's Role lacks {sorted(missing)} on {res}")
    bindings = [d for d in docs if d.get("kind") == "RoleBinding"]
    if not any(
        s.get("kind") == "ServiceAccount" and s.get("name") == WORKER_ACCOUNT
        for b in bindings
        for s in b.get("subjects", [])
    ):
        problems.append(f"{PATH}: no RoleBinding for the humanline-worker ServiceAccount")
    return problems


def check_worker_account(where: str, pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """A Celery worker's pod (deploy/k8s/humanline.yaml): every worker, the GPU ones too (the
    gpu queue takes multi-node jobs), runs as the account the Role is bound to, and creates
    TrainJobs in its own namespace (not `default`, where it has no rights)."""
    problems = []
    if pod.get("serviceAccountName") != WORKER_ACCOUNT:
        problems.append(
            f"{where}: runs as {pod.get('serviceAccountName') or 'default'}, not {WORKER_ACCOUNT} "
            "(its TrainJob submits would get HTTP 403)"
        )
    if not any(e.get("name") == "TRAINJOB_NAMESPACE" for e in container.get("env") or []):
        problems.append(f"{where}: set TRAINJOB_NAMESPACE (the Role's namespace)")
    return problems
