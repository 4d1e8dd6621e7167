"""Why a TrainJob is not where it should be, read from what Kubernetes shows besides its
conditions (worker.launchers.trainjob).

  - Creation failures: Trainer records a JobSet it cannot create only as an Event
    (TrainJobResourcesCreationFailed: a webhook, a ResourceQuota, a bad runtime), and the Job
    controller a pod it may not create as FailedCreate (PodSecurity `restricted`, a missing
    service account). The TrainJob itself keeps no condition. Both end the attempt at once.
  - Slow starts: pods that are not scheduled or cannot pull their image (FailedScheduling,
    Failed, BackOff) name the cause of a start deadline (worker.reconcile_watch).
  - Disruptions: a pod evicted by a drain, preempted or deleted by the scheduler carries a
    DisruptionTarget condition; its attempt is no failure of the job (LaunchStatus.reason
    DISRUPTED).
  - Admission: Kueue's Workload of the TrainJob says why it is not admitted
    (QuotaReserved/Admitted False); no Workload at all means Kueue does not manage it.

Every object of a TrainJob is named from it (the JobSet: its name; the Job: name-node-0; the
pods: name-node-0-N-xxxxx), so its Events are the Warnings whose object's name starts with it.
"""

from __future__ import annotations

from typing import Any

CREATION_FAILED = frozenset({"TrainJobResourcesCreationFailed", "FailedCreate"})
WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOADS = "kueue.x-k8s.io", "v1beta1", "workloads"
WORKLOAD_JOB_UID = "kueue.x-k8s.io/job-uid"
MAX_REASONS = 3


def _get(obj: Any, *path: str) -> Any:
    """obj.a.b (a client model) or obj["a"]["b"] (a dict), None where absent."""
    for key in path:
        if obj is None:
            return None
        obj = obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)
    return obj


def warnings_of(events: list[Any], name: str) -> list[tuple[str, str]]:
    """(reason, message) of the Warning events of `name`'s objects, newest last, deduped."""
    mine = [
        e
        for e in events
        if _get(e, "type") == "Warning"
        and (
            (_get(e, "involved_object", "name") or "") == name
            or (_get(e, "involved_object", "name") or "").startswith(f"{name}-")
        )
    ]
    mine.sort(key=lambda e: str(_get(e, "last_timestamp") or _get(e, "event_time") or ""))
    seen: dict[tuple[str, str], None] = {}
    for e in mine:
        seen[(str(_get(e, "reason") or ""), str(_get(e, "message") or ""))] = None
    return list(seen)


def creation_failure(warnings: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The last (reason, message) that says the JobSet or its pods cannot be created."""
    failed = [w for w in warnings if w[0] in CREATION_FAILED]
    return failed[-1] if failed else None


def summary(warnings: list[tuple[str, str]]) -> str | None:
    """The last few warnings as one sentence (a slow start's cause), None without any."""
    if not warnings:
        return None
    return "; ".join(f"{r}: {m}" for r, m in warnings[-MAX_REASONS:])


def pod_waiting(pods: list[Any]) -> list[tuple[str, str]]:
    """(reason, message) of containers waiting with a reason (ErrImagePull, ...)."""
    out = []
    for pod in pods:
        for cs in _get(pod, "status", "container_statuses") or []:
            reason = _get(cs, "state", "waiting", "reason")
            if reason and reason != "ContainerCreating":
                out.append((str(reason), str(_get(cs, "state", "waiting", "message") or "")))
    return out


def disruption(pods: list[Any]) -> str | None:
    """A sentence naming the disrupted pod and why, when one carries DisruptionTarget True."""
    for pod in pods:
        for cond in _get(pod, "status", "conditions") or []:
            if _get(cond, "type") == "DisruptionTarget" and _get(cond, "status") == "True":
                why = _get(cond, "reason") or "disrupted"
                text = _get(cond, "message") or ""
                return f"pod {_get(pod, 'metadata', 'name')} {why}: {text}".strip(": ")
    return None


def workload_reason(workloads: list[dict[str, Any]]) -> str:
    """Why Kueue has not admitted the TrainJob, from its Workloads' conditions."""
    if not workloads:
        return (
            "Kueue made no Workload for it: is Kueue's TrainJob integration enabled, and does "
            "the kueue.x-k8s.io/queue-name label name a LocalQueue of this namespace?"
        )
    for kind in ("QuotaReserved", "Admitted", "Evicted"):
        for wl in workloads:
            for cond in _get(wl, "status", "conditions") or []:
                if cond.get("type") == kind and cond.get("message"):
                    return f"Kueue: {cond.get('reason') or kind}: {cond['message']}"
    return "Kueue has its Workload but gives no reason"
