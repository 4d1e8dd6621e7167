"""A stateful in-memory fake of the Kubernetes API (the parts the TrainJob launcher uses), over
HTTP on 127.0.0.1, for the real `kubernetes` client: TrainJobs (create/get/list/delete), pods by
label selector, pod logs, Events, Kueue Workloads. Tests drive it with helpers (conditions,
pods, logs) and inject errors (`fail`) and delays (`delay`). Fixture: `fake_k8s` (a FakeK8s
with `.api_client`).

Where the real cluster behaves in ways that break a naive control plane, so does this one:
  - Trainer's condition reasons (`complete`: AllJobsCompleted, `fail_jobs`: FailedJobs);
  - a deletionTimestamp window (`deletion_window`: a deleted TrainJob lingers, marked, for
    that many further requests before it is gone);
  - a JobSet that cannot be created leaves no condition, only an Event
    (`creation_fails`: TrainJobResourcesCreationFailed);
  - Kueue re-suspends a running TrainJob on preemption (`preempt`: its pods are deleted) and
    admits it again (`admit`); its Workload says why it waits (`workload`);
  - the JobSet re-creation bug of Trainer <= v2.3: a TrainJob deleted in the foreground can
    leave its pods re-created beside the retry (`recreate_on_foreground`)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client

_TRAINJOBS = re.compile(
    r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs(?:/([^/]+))?$"
)
JOBSET = "jobset.sigs.k8s.io/jobset-name"
_PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)/log)?$")
_EVENTS = re.compile(r"^/api/v1/namespaces/([^/]+)/events$")
_WORKLOADS = re.compile(r"^/apis/kueue\.x-k8s\.io/v1beta1/namespaces/([^/]+)/workloads$")


class FakeK8s:
    def __init__(self) -> None:
        self.trainjobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.logs: dict[tuple[str, str], str] = {}
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, body)
        self.faults: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.workloads: list[dict[str, Any]] = []
        self.deletion_window = 0  # requests a deleted TrainJob lingers with deletionTimestamp
        self.recreate_on_foreground = False  # Trainer <= v2.3's JobSet re-creation bug
        self._deleting: dict[tuple[str, str], int] = {}
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        cfg = client.Configuration(host=f"http://127.0.0.1:{self.server.server_address[1]}")
        cfg.retries = 0
        self.api_client = client.ApiClient(cfg)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.api_client.close()

    # --- test helpers ----------------------------------------------------------------------

    def fail(self, status: int, *, method: str = "", path: str = "", times: int = 1) -> None:
        """The next `times` requests matching method/path (substring) answer HTTP `status`."""
        self.faults.append({"status": status, "method": method, "path": path, "times": times})

    def delay(self, seconds: float, *, method: str = "", path: str = "", times: int = 1) -> None:
        """The next `times` matching requests sleep `seconds` before being answered."""
        self.faults.append({"sleep": seconds, "method": method, "path": path, "times": times})

    def trainjob(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return self.trainjobs.get((namespace, name))

    def set_condition(
        self,
        name: str,
        type: str,
        status: str = "True",
        reason: str = "",
        message: str = "",
        namespace: str = "default",
    ) -> None:
        obj = self.trainjobs[(namespace, name)]
        conds = [c for c in obj.setdefault("status", {}).get("conditions", []) if c["type"] != type]
        conds.append(
            {
                "type": type,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        )
        obj["status"]["conditions"] = conds
        if type == "Suspended" and status == "False":
            obj["spec"]["suspend"] = False

    def complete(self, name: str, namespace: str = "default") -> None:
        self.set_condition(name, "Complete", reason="AllJobsCompleted", namespace=namespace)

    def fail_jobs(self, name: str, message: str = "", namespace: str = "default") -> None:
        self.set_condition(
            name, "Failed", reason="FailedJobs", message=message, namespace=namespace
        )

    def creation_fails(self, name: str, message: str, namespace: str = "default") -> None:
        """Trainer could not create the JobSet: no condition, no pod, only this Event."""
        self.events.append(
            {
                "metadata": {"name": f"{name}.{len(self.events)}", "namespace": namespace},
                "involvedObject": {"kind": "TrainJob", "name": name, "namespace": namespace},
                "reason": "TrainJobResourcesCreationFailed",
                "message": message,
                "type": "Warning",
                "lastTimestamp": f"2026-01-01T00:00:{len(self.events):02d}Z",
            }
        )

    def preempt(self, name: str, namespace: str = "default") -> None:
        """Kueue evicts it: suspended again, its pods deleted (the JobSet is suspended)."""
        self.trainjobs[(namespace, name)]["spec"]["suspend"] = True
        self.set_condition(name, "Suspended", reason="Suspended", namespace=namespace)
        self.set_pods(name, [], namespace=namespace)

    def admit(self, name: str, namespace: str = "default") -> None:
        self.set_condition(name, "Suspended", "False", reason="Resumed", namespace=namespace)

    def workload(self, name: str, conditions: list[dict[str, Any]], ns: str = "default") -> None:
        """Kueue's Workload of TrainJob `name` (labelled with its uid)."""
        uid = self.trainjobs[(ns, name)]["metadata"]["uid"]
        labels = {"kueue.x-k8s.io/job-uid": uid}
        meta = {"name": f"trainjob-{name}-0a1b2", "namespace": ns, "labels": labels}
        self.workloads.append({"metadata": meta, "status": {"conditions": conditions}})

    def set_pods(
        self,
        name: str,
        phases: list[str],
        namespace: str = "default",
        log: str = "",
        conditions: list[dict[str, Any]] | None = None,
    ) -> None:
        """The JobSet's pods of TrainJob `name`: one per node, node i in phase phases[i];
        `conditions`: node 1's pod conditions (e.g. a DisruptionTarget of a drained node)."""
        for key in [
            k
            for k, p in self.pods.items()
            if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name
            and k[0] == namespace
        ]:
            del self.pods[key]
        for i, phase in enumerate(phases):
            pod = f"{name}-node-0-{'zyxwvu'[i % 6]}{i}"  # node 1 sorts first: select, not sort
            self.pods[(namespace, pod)] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod,
                    "namespace": namespace,
                    "labels": {
                        "jobset.sigs.k8s.io/jobset-name": name,
                        "jobset.sigs.k8s.io/replicatedjob-name": "node",
                        "jobset.sigs.k8s.io/job-index": "0",  # one indexed Job of numNodes pods
                        "batch.kubernetes.io/job-completion-index": str(i),
                    },
                },
                "spec": {"containers": [{"name": "node", "image": "trainer"}]},
                "status": {"phase": phase, "conditions": list(conditions or []) if i == 1 else []},
            }
            self.logs[(namespace, pod)] = log if i == 0 else f"node {i}\n"

    # --- the server ------------------------------------------------------------------------

    def _fault(self, method: str, path: str) -> dict[str, Any] | None:
        with self.lock:
            for fault in self.faults:
                if fault["method"] in ("", method) and fault["path"] in path:
                    fault["times"] -= 1
                    if fault["times"] <= 0:
                        self.faults.remove(fault)
                    return fault
        return None

    def handle(self, method: str, url: str, body: Any) -> tuple[int, Any]:
        parsed = urlparse(url)
        path, query = parsed.path, parse_qs(parsed.query)
        self.requests.append((method, path, body))
        fault = self._fault(method, path)
        if fault and "sleep" in fault:
            time.sleep(fault["sleep"])
        elif fault:
            return fault["status"], _status(fault["status"], f"injected HTTP {fault['status']}")
        with self.lock:
            self._tick_deletions()
            if m := _TRAINJOBS.match(path):
                return self._trainjobs(method, m.group(1), m.group(2), body, query)
            if m := _PODS.match(path):
                return self._pods(method, m.group(1), m.group(2), query)
            if m := _EVENTS.match(path):
                sel = query.get("fieldSelector", [""])[0]
                items = [
                    e
                    for e in self.events
                    if e["metadata"]["namespace"] == m.group(1)
                    and (sel != "type=Warning" or e["type"] == "Warning")
                ]
                return 200, {"apiVersion": "v1", "kind": "EventList", "items": items}
            if m := _WORKLOADS.match(path):
                items = [w for w in self.workloads if _selected(w, query)]
                return 200, {"apiVersion": "kueue.x-k8s.io/v1beta1", "items": items}
        return 404, _status(404, f"no route {method} {path}")

    def _tick_deletions(self) -> None:
        for key in list(self._deleting):
            self._deleting[key] -= 1
            if self._deleting[key] < 0:
                del self._deleting[key]
                self._remove(*key)

    def _remove(self, ns: str, name: str) -> None:
        self.trainjobs.pop((ns, name), None)
        for key in [
            k
            for k, p in self.pods.items()
            if k[0] == ns and p["metadata"]["labels"].get(JOBSET) == name
        ]:
            del self.pods[key]

    def _trainjobs(
        self, method: str, ns: str, name: str | None, body: Any, query: dict[str, list[str]]
    ) -> tuple[int, Any]:
        if name is None and method == "POST":
            name = body["metadata"]["name"]
            if (ns, name) in self.trainjobs:
                return 409, _status(
                    409, f'trainjobs.trainer.kubeflow.org "{name}" already exists', "AlreadyExists"
                )
            obj = json.loads(json.dumps(body))
            obj["metadata"].update(
                namespace=ns,
                uid=f"uid-{len(self.requests)}",
                creationTimestamp="2026-01-01T00:00:00Z",
            )
            self.trainjobs[(ns, name)] = obj
            return 201, obj
        if name is None and method == "GET":
            items = [o for (n, _), o in self.trainjobs.items() if n == ns and _selected(o, query)]
            return 200, {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJobList",
                "metadata": {},
                "items": items,
            }
        obj = self.trainjobs.get((ns, name or ""))
        if obj is None:
            return 404, _status(
                404, f'trainjobs.trainer.kubeflow.org "{name}" not found', "NotFound"
            )
        if method == "GET":
            return 200, obj
        if method == "DELETE":
            foreground = (body or {}).get("propagationPolicy") == "Foreground"
            pods = {
                k: p for k, p in self.pods.items() if p["metadata"]["labels"].get(JOBSET) == name
            }
            if self.deletion_window > 0:
                obj["metadata"].setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
                self._deleting.setdefault((ns, name or ""), self.deletion_window)
            else:
                self._remove(ns, name or "")
            if foreground and self.recreate_on_foreground:
                self.pods.update(pods)  # the JobSet re-created: its pods run on, orphaned
            return 200, _status(200, "deleted", "")
        return 405, _status(405, f"{method} not allowed")

    def _pods(
        self, method: str, ns: str, pod: str | None, query: dict[str, list[str]]
    ) -> tuple[int, Any]:
        if pod is not None:
            if (ns, pod) not in self.pods:
                return 404, _status(404, f'pods "{pod}" not found', "NotFound")
            lines = self.logs.get((ns, pod), "").splitlines(keepends=True)
            tail = int(query.get("tailLines", ["0"])[0] or 0)
            return 200, "".join(lines[-tail:] if tail else lines)
        wanted = dict(s.split("=", 1) for s in query.get("labelSelector", [""])[0].split(",") if s)
        items = [
            p
            for (n, _), p in self.pods.items()
            if n == ns and all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())
        ]
        return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}


def _selected(obj: dict[str, Any], query: dict[str, list[str]]) -> bool:
    """`obj` matches the query's labelSelector (`key` exists, `key=value`)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, query.get("labelSelector", [""])[0].split(",")):
        key, eq, value = term.partition("=")
        if key not in labels or (eq and labels[key] != value):
            return False
    return True


def _status(code: int, message: str, reason: str = "Failure") -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure" if code >= 400 else "Success",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _handler(fake: FakeK8s) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            code, payload = fake.handle(self.command, self.path, body)
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            kind = "text/plain" if isinstance(payload, str) else "application/json"
            try:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout)

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

    return Handler


@pytest.fixture
def fake_k8s() -> Iterator[FakeK8s]:
    fake = FakeK8s()
    yield fake
    fake.close()
