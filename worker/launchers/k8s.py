"""Kubernetes plumbing of the TrainJob launcher (worker.launchers.trainjob): names and label
values, which API errors are transient, their messages, and the API client."""

from __future__ import annotations

import hashlib
import json
import re

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

MAX_NAME = 63
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


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


def transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in (0, None, 429) or exc.status >= 500
    return isinstance(exc, (urllib3.exceptions.HTTPError, OSError))


def api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.body or "")
    except (ValueError, AttributeError):
        return str(exc.body or "")


def default_client() -> client.ApiClient:
    """In-cluster credentials when the worker runs in a pod, else the kubeconfig. urllib3's own
    retries are off: the launcher's bounded retries are the only ones."""
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        config.load_kube_config(client_configuration=cfg)
    cfg.retries = 0
    return client.ApiClient(cfg)
