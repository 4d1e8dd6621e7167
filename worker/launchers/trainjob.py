"""A launch as a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1), through the
real `kubernetes` client.

The TrainJob names a ClusterTrainingRuntime (ours, with the torch plugin): the Trainer makes a
JobSet with one replicated job `node` of `numNodes` pods, container `node`, and gives each
pod's torchrun its place through PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
PET_MASTER_ADDR and PET_MASTER_PORT. The launcher sets `command: [torchrun]` and the request's
args (the trainer's argv after torchrun, e.g. `-m trainer run SPEC_URL ...`).

JobSet pods carry `jobset.sigs.k8s.io/jobset-name` (= the TrainJob's name),
`jobset.sigs.k8s.io/replicatedjob-name` (`node`) and `jobset.sigs.k8s.io/job-index`; the torch
runtime's `node` is ONE indexed Job of numNodes pods, so node k is the pod whose
`batch.kubernetes.io/job-completion-index` is k (PET_NODE_RANK comes from it).

Every API call has a request timeout; transient failures (5xx, 429, timeouts, connection
errors) are retried a bounded number of times with exponential backoff, then raise
LauncherError; any other 4xx raises LauncherError at once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from worker.launchers.base import LauncherError, LaunchRequest, LaunchState, LaunchStatus

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
PLURAL = "trainjobs"
KIND = "TrainJob"
RUNTIME_KIND = "ClusterTrainingRuntime"
NODE = "node"  # the runtime's replicated job and its container

JOB_LABEL = "humanline.dev/job-id"
ATTEMPT_LABEL = "humanline.dev/attempt"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

MAX_NAME = 63
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")

T = TypeVar("T")


def trainjob_name(job_id: str, attempt: int) -> str:
    """An RFC 1035 label (lowercase alphanumerics and '-', starts with a letter, ends with an
    alphanumeric, <= 63 chars) decided by (job id, attempt) alone. A name that had to be
    shortened or cleaned keeps a hash of the exact pair, so two pairs never share one."""
    raw = f"hl-{job_id}-a{attempt}"
    clean = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", raw.lower())).strip("-")
    if clean == raw and len(clean) <= MAX_NAME:
        return clean
    digest = hashlib.sha256(f"{job_id}\0{attempt}".encode()).hexdigest()[:10]
    tail = f"-a{attempt}-{digest}"
    head = clean[: MAX_NAME - len(tail)].rstrip("-")
    return f"{head}{tail}"


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in (0, None, 429) or exc.status >= 500
    return isinstance(exc, (urllib3.exceptions.HTTPError, OSError))


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


class TrainJobLauncher:
    def __init__(
        self,
        namespace: str,
        runtime: str,
        image: str | None = None,
        queue: str | None = None,
        api_client: client.ApiClient | None = None,
        timeout_s: float = 10.0,
        tries: int = 4,
        backoff_s: float = 0.5,
    ):
        self.namespace, self.runtime, self.image, self.queue = namespace, runtime, image, queue
        self.timeout_s, self.tries, self.backoff_s = timeout_s, tries, backoff_s
        api = api_client or _default_client()
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    # --- the interface ---------------------------------------------------------------------

    def launch_name(self, job_id: str, attempt: int) -> str:
        return trainjob_name(job_id, attempt)

    def manifest(self, request: LaunchRequest) -> dict[str, Any]:
        """The TrainJob for `request` (validated against the Trainer's API types in tests)."""
        for value in (request.job_id, *request.labels.values()):
            if not _LABEL_VALUE.match(value) or len(value) > MAX_NAME:
                raise LauncherError(f"{value!r} is not a valid Kubernetes label value")
        labels = {**request.labels, JOB_LABEL: request.job_id, ATTEMPT_LABEL: str(request.attempt)}
        trainer: dict[str, Any] = {
            "numNodes": request.nodes,
            "numProcPerNode": request.processes_per_node,
            "command": ["torchrun"],
            "args": list(request.args),
            "env": [{"name": k, "value": v} for k, v in sorted(request.env.items())],
        }
        if self.image:
            trainer["image"] = self.image
        if request.gpus_per_node:
            gpus = str(request.gpus_per_node)
            trainer["resourcesPerNode"] = {
                "requests": {"nvidia.com/gpu": gpus},
                "limits": {"nvidia.com/gpu": gpus},
            }
        spec: dict[str, Any] = {
            "runtimeRef": {"apiGroup": GROUP, "kind": RUNTIME_KIND, "name": self.runtime},
            "trainer": trainer,
        }
        if self.queue:
            labels[QUEUE_LABEL] = self.queue
            spec["suspend"] = True  # Kueue admits (unsuspends) it when the gang fits
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": {
                "name": self.launch_name(request.job_id, request.attempt),
                "namespace": self.namespace,
                "labels": labels,
            },
            "spec": spec,
        }

    def submit(self, request: LaunchRequest) -> str:
        body = self.manifest(request)
        name: str = body["metadata"]["name"]
        try:
            self._call(
                f"create TrainJob {name}",
                lambda t: self.custom.create_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, body, _request_timeout=t
                ),
                conflict_ok=True,
            )
            return name
        except _Conflict:
            pass
        existing = self._get(name)  # 409: adopt the one already there if it is ours
        if existing is None:
            raise LauncherError(f"TrainJob {name} conflicted on create but is gone; retry")
        labels = (existing.get("metadata") or {}).get("labels") or {}
        ours = labels.get(JOB_LABEL) == request.job_id and labels.get(ATTEMPT_LABEL) == str(
            request.attempt
        )
        if not ours:
            raise LauncherError(
                f"TrainJob {name} already exists in namespace {self.namespace} and belongs to "
                f"job {labels.get(JOB_LABEL)!r} attempt {labels.get(ATTEMPT_LABEL)!r}, not "
                f"job {request.job_id!r} attempt {request.attempt}"
            )
        if (existing.get("metadata") or {}).get("deletionTimestamp"):
            raise LauncherError(f"TrainJob {name} is still being deleted; submit again later")
        return name

    def poll(self, name: str) -> LaunchStatus:
        obj = self._get(name)
        if obj is None:
            return LaunchStatus(LaunchState.MISSING, message=f"TrainJob {name} does not exist")
        trainer = (obj.get("spec") or {}).get("trainer") or {}
        nodes, per_node = int(trainer.get("numNodes") or 1), trainer.get("numProcPerNode")
        per_node = per_node if isinstance(per_node, int) else 1
        total = nodes * per_node
        for kind, state in (("Complete", LaunchState.SUCCEEDED), ("Failed", LaunchState.FAILED)):
            cond = _condition(obj, kind)
            if cond is not None:
                return LaunchStatus(
                    state, cond.get("reason"), cond.get("message"), ranks_total=total
                )
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            return LaunchStatus(
                LaunchState.FAILED, "Deleting", f"TrainJob {name} is being deleted", 0, total
            )
        cond = _condition(obj, "Suspended")
        if cond is not None or (obj.get("spec") or {}).get("suspend"):
            reason, message = (cond or {}).get("reason"), (cond or {}).get("message")
            return LaunchStatus(LaunchState.PENDING, reason, message, ranks_total=total)
        running = sum(1 for pod in self._pods(name) if pod.status and pod.status.phase == "Running")
        ranks = min(running, nodes) * per_node
        state = LaunchState.RUNNING if running >= nodes else LaunchState.STARTING
        return LaunchStatus(state, ranks_running=ranks, ranks_total=total)

    def cancel(self, name: str) -> None:
        self._delete(name)

    def cleanup(self, name: str) -> None:
        self._delete(name)

    def logs(self, name: str, tail_lines: int = 200) -> str:
        pods = self._pods(name, {REPLICATED_JOB: NODE, JOB_INDEX: "0", COMPLETION_INDEX: "0"})
        names = sorted(p.metadata.name for p in pods if p.metadata and p.metadata.name)
        if not names:
            return ""
        pod = names[0]
        try:
            text = self._call(
                f"read the log of pod {pod}",
                lambda t: self.core.read_namespaced_pod_log(
                    pod, self.namespace, container=NODE, tail_lines=tail_lines, _request_timeout=t
                ),
                missing_ok=True,
            )
        except _Missing:
            return ""
        return text if isinstance(text, str) else str(text or "")

    # --- calls -----------------------------------------------------------------------------

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            obj = self._call(
                f"read TrainJob {name}",
                lambda t: self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, name, _request_timeout=t
                ),
                missing_ok=True,
            )
        except _Missing:
            return None
        return obj if isinstance(obj, dict) else None

    def _pods(self, name: str, extra: dict[str, str] | None = None) -> list[client.V1Pod]:
        selector = ",".join(f"{k}={v}" for k, v in {JOBSET_NAME: name, **(extra or {})}.items())
        result = self._call(
            f"list the pods of TrainJob {name}",
            lambda t: self.core.list_namespaced_pod(
                self.namespace, label_selector=selector, _request_timeout=t
            ),
        )
        return list(result.items or [])

    def _delete(self, name: str) -> None:
        options = client.V1DeleteOptions(propagation_policy="Foreground")
        try:
            self._call(
                f"delete TrainJob {name}",
                lambda t: self.custom.delete_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, name, body=options, _request_timeout=t
                ),
                missing_ok=True,
            )
        except _Missing:
            pass

    def _call(
        self,
        what: str,
        fn: Callable[[float], T],
        *,
        missing_ok: bool = False,
        conflict_ok: bool = False,
    ) -> T:
        """`fn(timeout)` with bounded retries of transient failures; 404/409 become _Missing /
        _Conflict where the caller handles them, anything else a LauncherError."""
        retrying = Retrying(
            retry=retry_if_exception(_transient),
            stop=stop_after_attempt(self.tries),
            wait=wait_exponential(multiplier=self.backoff_s, max=8 * self.backoff_s),
            reraise=True,
        )
        try:
            return retrying(fn, self.timeout_s)
        except ApiException as exc:
            if missing_ok and exc.status == 404:
                raise _Missing from exc
            if conflict_ok and exc.status == 409:
                raise _Conflict from exc
            tried = f" after {self.tries} tries" if _transient(exc) else ""
            raise LauncherError(
                f"Kubernetes refused to {what} in namespace {self.namespace}{tried}: "
                f"HTTP {exc.status} {exc.reason}: {_api_message(exc)}"
            ) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise LauncherError(
                f"could not {what} in namespace {self.namespace}: the Kubernetes API did not "
                f"answer after {self.tries} tries of {self.timeout_s:g} s each "
                f"({type(exc).__name__}: {exc})"
            ) from exc


class _Missing(Exception):
    pass


class _Conflict(Exception):
    pass


def _api_message(exc: ApiException) -> str:
    import json

    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.body or "")
    except (ValueError, AttributeError):
        return str(exc.body or "")


def _default_client() -> client.ApiClient:
    """In-cluster credentials when the worker runs in a pod, else the kubeconfig. urllib3's own
    retries are off: the launcher's bounded retries are the only ones."""
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        config.load_kube_config(client_configuration=cfg)
    cfg.retries = 0
    return client.ApiClient(cfg)


def trainjob_launcher(settings: Any) -> TrainJobLauncher:
    """The launcher the deployment's settings describe (TRAINJOB_NAMESPACE, TRAINJOB_RUNTIME,
    TRAINJOB_QUEUE, TRAINJOB_IMAGE)."""
    return TrainJobLauncher(
        namespace=settings.TRAINJOB_NAMESPACE,
        runtime=settings.TRAINJOB_RUNTIME,
        image=settings.TRAINJOB_IMAGE or None,
        queue=settings.TRAINJOB_QUEUE or None,
    )
