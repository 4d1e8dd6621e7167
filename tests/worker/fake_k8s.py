"""A stateful in-memory fake of the Kubernetes API (the parts the TrainJob launcher uses), over
HTTP on 127.0.0.1, for the real `kubernetes` client: TrainJobs (create/get/list/delete), pods by
label selector, pod logs. Tests drive it with helpers (conditions, pods, logs) and inject
errors (`fail`) and delays (`delay`). Fixture: `fake_k8s` (a FakeK8s with `.api_client`)."""

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


class FakeK8s:
    def __init__(self) -> None:
        self.trainjobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.logs: dict[tuple[str, str], str] = {}
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, body)
        self.faults: list[dict[str, Any]] = []
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

    def set_pods(
        self, name: str, phases: list[str], namespace: str = "default", log: str = ""
    ) -> None:
        """The JobSet's pods of TrainJob `name`: one per node, node i in phase phases[i]."""
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
                "status": {"phase": phase},
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
            if m := _TRAINJOBS.match(path):
                return self._trainjobs(method, m.group(1), m.group(2), body)
            if m := _PODS.match(path):
                return self._pods(method, m.group(1), m.group(2), query)
        return 404, _status(404, f"no route {method} {path}")

    def _trainjobs(self, method: str, ns: str, name: str | None, body: Any) -> tuple[int, Any]:
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
            items = [o for (n, _), o in self.trainjobs.items() if n == ns]
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
            del self.trainjobs[(ns, name or "")]
            for key in [
                k
                for k, p in self.pods.items()
                if k[0] == ns
                and p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name
            ]:
                del self.pods[key]
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
