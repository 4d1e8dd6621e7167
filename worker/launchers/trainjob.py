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

from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from worker.launchers import trainjob_explain as explain
from worker.launchers.base import (
    DISRUPTED,
    LauncherError,
    LaunchRequest,
    LaunchState,
    LaunchStatus,
)
from worker.launchers.k8s import (
    LABEL_VALUE,
    MAX_NAME,
    api_message,
    default_client,
    trainjob_name,
    transient,
)

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


T = TypeVar("T")


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
        api = api_client or default_client()
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    # --- the interface ---------------------------------------------------------------------

    def launch_name(self, job_id: str, attempt: int) -> str:
        return trainjob_name(job_id, attempt)

    def manifest(self, request: LaunchRequest) -> dict[str, Any]:
        """The TrainJob for `request` (validated against the Trainer's API types in tests)."""
        for value in (request.job_id, *request.labels.values()):
            if not LABEL_VALUE.match(value) or len(value) > MAX_NAME:
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
        # GPUs always said, 0 included: else a CPU job gets the runtime's 8 GPUs per node
        gpus = {"nvidia.com/gpu": str(request.gpus_per_node)}
        trainer["resourcesPerNode"] = {"requests": {**request.requests, **gpus}, "limits": gpus}
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
        """Its conditions (Complete, Failed, Suspended), then its pods; a Failed one with a
        disrupted pod is DISRUPTED; an admitted one with missing pods reads the Warnings:
        a creation failure fails it at once, others name the wait (trainjob_explain)."""
        obj = self._get(name)
        if obj is None:
            return LaunchStatus(LaunchState.MISSING, message=f"TrainJob {name} does not exist")
        trainer = (obj.get("spec") or {}).get("trainer") or {}
        nodes, per_node = int(trainer.get("numNodes") or 1), trainer.get("numProcPerNode")
        per_node = per_node if isinstance(per_node, int) else 1
        total = nodes * per_node
        for kind, state in (("Complete", LaunchState.SUCCEEDED), ("Failed", LaunchState.FAILED)):
            cond = _condition(obj, kind)
            if cond is not None and kind == "Failed":
                disrupted = explain.disruption(self._pods(name))
                if disrupted is not None:
                    return LaunchStatus(state, DISRUPTED, disrupted, ranks_total=total)
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
        pods = self._pods(name)
        running = sum(1 for pod in pods if pod.status and pod.status.phase == "Running")
        ranks = min(running, nodes) * per_node
        if running >= nodes:
            return LaunchStatus(LaunchState.RUNNING, ranks_running=ranks, ranks_total=total)
        warnings = [*self._warnings(name), *explain.pod_waiting(pods)]
        failed = explain.creation_failure(warnings)
        if failed is not None:
            return LaunchStatus(LaunchState.FAILED, *failed, ranks_running=ranks, ranks_total=total)
        why = explain.summary(warnings) or (
            f"{len(pods)} of {nodes} pods created" if pods else "no pod created (no JobSet?)"
        )
        return LaunchStatus(LaunchState.STARTING, None, why, ranks, total)

    def list_launches(self) -> list[tuple[str, str, int]]:
        """(name, job id, attempt) of every TrainJob of ours (labelled) in the namespace."""
        result = self._call(
            "list TrainJobs",
            lambda t: self.custom.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, label_selector=JOB_LABEL,
                _request_timeout=t,
            ),
        )  # fmt: skip
        out = []
        for obj in _items(result):
            meta = obj.get("metadata") or {}
            labels = meta.get("labels") or {}
            if str(labels.get(ATTEMPT_LABEL, "")).isdigit():
                out.append((str(meta["name"]), str(labels[JOB_LABEL]), int(labels[ATTEMPT_LABEL])))
        return out

    def waiting_reason(self, name: str) -> str:
        """Why the TrainJob is not admitted: its Kueue Workload's reason (trainjob_explain);
        "" when the Workload cannot be read (no RBAC for it, or no Kueue)."""
        obj = self._get(name)
        uid = ((obj or {}).get("metadata") or {}).get("uid")
        if not uid:
            return ""
        try:
            result = self._call(
                f"list the Kueue Workloads of TrainJob {name}",
                lambda t: self.custom.list_namespaced_custom_object(
                    explain.WORKLOAD_GROUP, explain.WORKLOAD_VERSION, self.namespace,
                    explain.WORKLOADS, label_selector=f"{explain.WORKLOAD_JOB_UID}={uid}",
                    _request_timeout=t,
                ),
                missing_ok=True,
            )  # fmt: skip
        except (_Missing, LauncherError):
            return ""
        return explain.workload_reason(_items(result))

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

    def _warnings(self, name: str) -> list[tuple[str, str]]:
        """The Warning events of the TrainJob's objects; none when they cannot be read (the
        worker's Role lacks events: the start deadline still ends the attempt)."""
        try:
            result = self._call(
                f"list the events of TrainJob {name}",
                lambda t: self.core.list_namespaced_event(
                    self.namespace, field_selector="type=Warning", _request_timeout=t
                ),
            )
        except LauncherError:
            return []
        return explain.warnings_of(list(result.items or []), name)

    def _delete(self, name: str) -> None:
        # Background, not Foreground: through Trainer v2.3 a TrainJob deleted in the
        # foreground can have its JobSet re-created beside the retry (kubeflow/trainer#2981,
        # #3737, #3779); the garbage collector removes the JobSet and pods after it is gone
        options = client.V1DeleteOptions(propagation_policy="Background")
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
            retry=retry_if_exception(transient),
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
            tried = f" after {self.tries} tries" if transient(exc) else ""
            raise LauncherError(
                f"Kubernetes refused to {what} in namespace {self.namespace}{tried}: "
                f"HTTP {exc.status} {exc.reason}: {api_message(exc)}"
            ) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise LauncherError(
                f"could not {what} in namespace {self.namespace}: the Kubernetes API did not "
                f"answer after {self.tries} tries of {self.timeout_s:g} s each "
                f"({type(exc).__name__}: {exc})"
            ) from exc


def _items(result: Any) -> list[dict[str, Any]]:
    """The items of a custom objects' list (a dict)."""
    items = result.get("items") if isinstance(result, dict) else None
    return [i for i in items or [] if isinstance(i, dict)]


class _Missing(Exception):
    pass


class _Conflict(Exception):
    pass


def trainjob_launcher(settings: Any) -> TrainJobLauncher:
    """The launcher the deployment's settings describe (TRAINJOB_NAMESPACE, TRAINJOB_RUNTIME,
    TRAINJOB_QUEUE, TRAINJOB_IMAGE)."""
    return TrainJobLauncher(
        namespace=settings.TRAINJOB_NAMESPACE,
        runtime=settings.TRAINJOB_RUNTIME,
        image=settings.TRAINJOB_IMAGE or None,
        queue=settings.TRAINJOB_QUEUE or None,
    )
