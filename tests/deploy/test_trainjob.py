"""deploy/k8s/trainjob.yaml (issue 26): the ClusterTrainingRuntime is valid against Kubeflow
Trainer's published API types (unknown fields included: the generated models drop them
silently, so the round trip must give the manifest back), and deploy_check's checks can fail."""

from __future__ import annotations

import copy

import pytest
import yaml
from kubeflow_trainer_api import models
from pydantic import ValidationError

from tools import deploy_trainjob as dt
from tools.deploy_check import built_images, check_k8s


def runtime() -> dict:
    return next(d for d in dt.load() if d["kind"] == "ClusterTrainingRuntime")


def strictly_valid(doc: dict) -> bool:
    """True when the published type accepts `doc` and keeps every field of it."""
    parsed = models.TrainerV1alpha1ClusterTrainingRuntime.from_dict(copy.deepcopy(doc))
    return parsed is not None and parsed.to_dict() == doc


def test_the_runtime_is_a_valid_cluster_training_runtime():
    doc = runtime()
    assert strictly_valid(doc)
    jobset = models.TrainerV1alpha1ClusterTrainingRuntime.from_dict(doc).spec.template.spec
    assert jobset.failure_policy.max_restarts == 0
    assert [r.name for r in jobset.replicated_jobs] == ["node"]


def _pod(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
        "spec"
    ]


def _node(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
        "spec"
    ]["containers"][0]


def test_a_misspelled_field_or_a_wrong_type_fails_validation():
    misspelled = runtime()
    misspelled["spec"]["template"]["spec"]["failurePolicy"]["maxRestart"] = 0
    assert not strictly_valid(misspelled)
    deep = runtime()
    _node(deep)["envFrm"] = []
    assert not strictly_valid(deep)
    wrong = runtime()
    wrong["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] = "0"
    with pytest.raises(ValidationError):
        strictly_valid(wrong)


def _check(mutate) -> list[str]:
    docs = dt.load()
    mutate({(d["kind"], d["metadata"]["name"]): d for d in docs})
    return dt.check_trainjob(built_images(), text=yaml.safe_dump_all(docs))


RT = ("ClusterTrainingRuntime", dt.RUNTIME_NAME)


def test_the_repository_is_consistent():
    assert dt.check_trainjob(built_images()) == []


def test_trainjob_checks_can_fail():
    def restarts(d):
        d[RT]["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] = 3

    def no_torch(d):
        del d[RT]["spec"]["mlPolicy"]["torch"]

    def renamed(d):
        _node(d[RT])["name"] = "trainer"

    def cpu_image(d):
        _node(d[RT])["image"] = "humanline/worker-cpu:latest"

    def no_dump(d):
        _node(d[RT])["env"] = [e for e in _node(d[RT])["env"] if "DUMP" not in e["name"]]

    def without(resource):
        def mutate(d):
            rules = d["Role", "humanline-trainjobs"]["rules"]
            rules[:] = [r for r in rules if resource not in r["resources"]]

        return mutate

    def token(d):
        del _pod(d[RT])["automountServiceAccountToken"]

    def no_binding(d):
        d["RoleBinding", "humanline-worker-trainjobs"]["subjects"][0]["name"] = "default"

    assert any("maxRestarts must be 0" in p for p in _check(restarts))
    assert any("mlPolicy.torch" in p for p in _check(no_torch))
    assert any("no container named 'node'" in p for p in _check(renamed))
    assert any("CPU image" in p for p in _check(cpu_image))
    assert any("TORCH_NCCL_DUMP_ON_TIMEOUT" in p for p in _check(no_dump))
    assert any("lacks ['get'] on pods/log" in p for p in _check(without("pods/log")))
    assert any("lacks ['get', 'list'] on events" in p for p in _check(without("events")))
    assert any("on workloads" in p for p in _check(without("workloads")))
    assert any("automountServiceAccountToken" in p for p in _check(token))
    assert any("no RoleBinding" in p for p in _check(no_binding))


def test_every_worker_runs_as_the_bound_account_in_its_own_namespace():
    """Issue 36: only the CPU worker had the account, but multi-node jobs route to the GPU
    workers, whose first TrainJob got a 403 (and TRAINJOB_NAMESPACE defaulted to `default`)."""
    docs = [d for d in yaml.safe_load_all((dt.ROOT / "deploy/k8s/humanline.yaml").read_text()) if d]
    assert {
        "kind": "ServiceAccount",
        "apiVersion": "v1",
        "metadata": {"name": dt.WORKER_ACCOUNT},
    } in docs
    assert check_k8s() == []
    gpu = next(d for d in docs if d["metadata"]["name"] == "humanline-worker-h100")
    pod = gpu["spec"]["template"]["spec"]
    del pod["serviceAccountName"]
    pod["containers"][0]["env"] = [{"name": "WORKER_GPUS", "value": "count:8"}]
    problems = check_k8s(text=yaml.safe_dump_all(docs))
    assert any("humanline-worker-h100/worker: runs as default" in p for p in problems)
    assert any("humanline-worker-h100/worker: set TRAINJOB_NAMESPACE" in p for p in problems)
