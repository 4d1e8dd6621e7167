"""The TrainJob launcher, driven by the real `kubernetes` client against tests/worker/fake_k8s."""

from __future__ import annotations

import re
import time

import pytest
from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

from tests.worker.fake_k8s import FakeK8s
from worker.launchers import LauncherError, LaunchRequest, LaunchState
from worker.launchers.base import DISRUPTED
from worker.launchers.trainjob import TrainJobLauncher, trainjob_name

JOB = "3f2a9c1e-8b7d-4e6f-9a0b-1c2d3e4f5a6b"
RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def request(job: str = JOB, attempt: int = 1) -> LaunchRequest:
    return LaunchRequest(
        job_id=job,
        attempt=attempt,
        nodes=2,
        processes_per_node=4,
        args=["-m", "trainer", "run", "s3://b/t/j/run/attempt-1/spec.json", "--out", "/scratch"],
        env={"AWS_ENDPOINT_URL_S3": "http://s3:8333"},
        gpus_per_node=4,
    )


def launcher(fake: FakeK8s, queue: str | None = "gpu-queue", **kw: object) -> TrainJobLauncher:
    return TrainJobLauncher(
        "default",
        "humanline-trainer",
        "trainer:1",
        queue,
        api_client=fake.api_client,
        backoff_s=0.01,
        **kw,  # type: ignore[arg-type]
    )


def test_names_are_deterministic_rfc1035_labels() -> None:
    assert trainjob_name(JOB, 1) == trainjob_name(JOB, 1) == f"hl-{JOB}-a1"
    long = "Team_" + "x" * 80
    names = {trainjob_name(j, a) for j in (JOB, long, long + "y", "9ABC") for a in (1, 2, 12)}
    assert len(names) == 12
    for name in names:
        assert RFC1035.match(name) and len(name) <= 63, name


def test_manifest_validates_against_the_trainer_api_types(fake_k8s: FakeK8s) -> None:
    body = launcher(fake_k8s).manifest(request())
    parsed = TrainerV1alpha1TrainJob.from_dict(body)
    assert parsed is not None
    # from_dict drops unknown keys: the round trip must keep every field we wrote
    assert parsed.to_dict() == body
    assert body["spec"]["suspend"] is True
    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert body["spec"]["trainer"]["numNodes"] == 2
    assert "suspend" not in launcher(fake_k8s, queue=None).manifest(request())["spec"]


def test_submit_creates_then_adopts_on_409(fake_k8s: FakeK8s) -> None:
    tj = launcher(fake_k8s)
    name = tj.submit(request())
    assert fake_k8s.trainjob(name) is not None
    assert tj.submit(request()) == name  # a second delivery adopts it
    posts = [r for r in fake_k8s.requests if r[0] == "POST"]
    assert len(posts) == 2 and len(fake_k8s.trainjobs) == 1


def test_a_409_on_someone_elses_trainjob_is_an_error(fake_k8s: FakeK8s) -> None:
    tj = launcher(fake_k8s)
    name = tj.submit(request())
    fake_k8s.trainjobs[("default", name)]["metadata"]["labels"]["humanline.dev/attempt"] = "7"
    with pytest.raises(LauncherError, match="belongs to job .* attempt '7'"):
        tj.submit(request())


def test_conditions_map_to_states_and_complete(fake_k8s: FakeK8s) -> None:
    tj = launcher(fake_k8s)
    name = tj.submit(request())
    fake_k8s.set_condition(name, "Suspended", reason="Suspended", message="waiting for Kueue")
    assert tj.poll(name).state == LaunchState.PENDING
    fake_k8s.set_condition(name, "Suspended", status="False", reason="Resumed")
    fake_k8s.set_pods(name, ["Pending", "Running"])
    status = tj.poll(name)
    assert (status.state, status.ranks_running, status.ranks_total) == (LaunchState.STARTING, 4, 8)
    fake_k8s.set_pods(name, ["Running", "Running"], log="a\nb\nstep 3\n")
    assert tj.poll(name).state == LaunchState.RUNNING
    assert tj.logs(name, tail_lines=2) == "b\nstep 3\n"
    fake_k8s.set_condition(name, "Complete", reason="JobsCompleted")
    assert tj.poll(name).state == LaunchState.SUCCEEDED


def test_failed_carries_reason_and_message(fake_k8s: FakeK8s) -> None:
    tj = launcher(fake_k8s, queue=None)
    name = tj.submit(request())
    fake_k8s.set_pods(name, ["Running", "Failed"])
    fake_k8s.set_condition(name, "Failed", reason="JobsFailed", message="node-1 exited 1")
    status = tj.poll(name)
    assert (status.state, status.reason, status.message) == (
        LaunchState.FAILED,
        "JobsFailed",
        "node-1 exited 1",
    )


def test_cancel_deletes_in_the_background_and_missing_then_reappears(fake_k8s: FakeK8s) -> None:
    """Background propagation: Trainer <= v2.3 can re-create a foreground-deleted TrainJob's
    JobSet beside the retry (the fake does, `recreate_on_foreground`); nothing is left here."""
    fake_k8s.recreate_on_foreground = True
    tj = launcher(fake_k8s)
    name = tj.submit(request())
    fake_k8s.set_pods(name, ["Running", "Running"])
    tj.cancel(name)
    deletes = [r for r in fake_k8s.requests if r[0] == "DELETE"]
    assert deletes[-1][2]["propagationPolicy"] == "Background"
    assert fake_k8s.pods == {}
    assert tj.poll(name).state == LaunchState.MISSING
    assert tj.logs(name) == ""
    tj.cancel(name)  # 404 is fine
    tj.cleanup(name)
    assert tj.submit(request()) == name  # resubmitted after delete: it reappears
    assert tj.poll(name).state == LaunchState.PENDING


def test_a_trainjob_in_its_deletion_window_is_not_adopted(fake_k8s: FakeK8s) -> None:
    fake_k8s.deletion_window = 2  # the DELETE, the POST and the GET of the adoption
    tj = launcher(fake_k8s)
    name = tj.submit(request())
    tj.cancel(name)
    assert fake_k8s.trainjob(name)["metadata"]["deletionTimestamp"]
    with pytest.raises(LauncherError, match="still being deleted"):
        tj.submit(request())
    assert tj.poll(name).state == LaunchState.MISSING  # gone once the window passed


def test_a_cpu_job_asks_for_no_gpu_and_its_requests(fake_k8s: FakeK8s) -> None:
    cpu = LaunchRequest(
        job_id=JOB, attempt=1, nodes=2, processes_per_node=2, args=["-m", "trainer"],
        requests={"cpu": "2", "memory": "10Gi"},
    )  # fmt: skip
    body = launcher(fake_k8s).manifest(cpu)
    assert body["spec"]["trainer"]["resourcesPerNode"] == {
        "requests": {"cpu": "2", "memory": "10Gi", "nvidia.com/gpu": "0"},
        "limits": {"nvidia.com/gpu": "0"},
    }
    assert TrainerV1alpha1TrainJob.from_dict(body).to_dict() == body


def test_a_jobset_that_cannot_be_created_fails_with_the_events_reason(fake_k8s: FakeK8s) -> None:
    """No condition, no pod: only Trainer's Event says why (PodSecurity, quota, webhook)."""
    tj = launcher(fake_k8s, queue=None)
    name = tj.submit(request())
    status = tj.poll(name)
    assert (status.state, status.message) == (LaunchState.STARTING, "no pod created (no JobSet?)")
    fake_k8s.creation_fails(name, 'pods "x" is forbidden: violates PodSecurity "restricted"')
    status = tj.poll(name)
    assert (status.state, status.reason) == (LaunchState.FAILED, "TrainJobResourcesCreationFailed")
    assert "PodSecurity" in status.message


def test_events_that_cannot_be_read_leave_it_starting(fake_k8s: FakeK8s) -> None:
    tj = launcher(fake_k8s, queue=None)
    name = tj.submit(request())
    fake_k8s.fail(403, path="/events", times=1)  # no RBAC for events: the deadline decides
    assert tj.poll(name).state == LaunchState.STARTING


def test_a_disrupted_pod_makes_the_failure_a_disruption(fake_k8s: FakeK8s) -> None:
    tj = launcher(fake_k8s)
    name = tj.submit(request())
    drained = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
               "message": "Eviction API: evicting"}  # fmt: skip
    fake_k8s.set_pods(name, ["Failed", "Failed"], conditions=[drained])
    fake_k8s.fail_jobs(name, "jobset failed")
    status = tj.poll(name)
    assert (status.state, status.reason) == (LaunchState.FAILED, DISRUPTED)
    assert "EvictionByEvictionAPI" in status.message


def test_list_launches_and_the_kueue_reason_of_a_wait(fake_k8s: FakeK8s) -> None:
    tj = launcher(fake_k8s)
    name = tj.submit(request())
    fake_k8s.trainjobs[("default", "theirs")] = {"metadata": {"name": "theirs", "labels": {}}}
    assert tj.list_launches() == [(name, JOB, 1)]
    assert "no Workload" in tj.waiting_reason(name)
    quota = "couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu"
    fake_k8s.workload(name, [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                              "message": quota}])  # fmt: skip
    assert tj.waiting_reason(name) == f"Kueue: Pending: {quota}"
    fake_k8s.fail(403, path="/workloads", times=1)
    assert tj.waiting_reason(name) == ""


def test_vanished_trainjob_is_missing(fake_k8s: FakeK8s) -> None:
    tj = launcher(fake_k8s)
    name = tj.submit(request())
    fake_k8s.trainjobs.clear()  # deleted behind our back
    assert tj.poll(name).state == LaunchState.MISSING


def test_a_500_is_retried(fake_k8s: FakeK8s) -> None:
    tj = launcher(fake_k8s)
    fake_k8s.fail(500, method="POST", times=2)
    name = tj.submit(request())
    assert fake_k8s.trainjob(name) is not None
    fake_k8s.fail(503, method="GET", times=1)
    assert tj.poll(name).state == LaunchState.PENDING


def test_retry_budget_exhausted_is_a_clear_error(fake_k8s: FakeK8s) -> None:
    tj = launcher(fake_k8s, tries=3)
    fake_k8s.fail(500, method="POST", times=5)
    with pytest.raises(LauncherError, match="create TrainJob .* after 3 tries: HTTP 500"):
        tj.submit(request())
    assert len([r for r in fake_k8s.requests if r[0] == "POST"]) == 3


def test_a_403_fails_at_once(fake_k8s: FakeK8s) -> None:
    tj = launcher(fake_k8s)
    fake_k8s.fail(403, method="POST", times=5)
    with pytest.raises(LauncherError, match="HTTP 403"):
        tj.submit(request())
    assert len([r for r in fake_k8s.requests if r[0] == "POST"]) == 1


def test_a_server_that_hangs_times_out_within_a_bound(fake_k8s: FakeK8s) -> None:
    tj = launcher(fake_k8s, timeout_s=0.3, tries=2)
    name = tj.submit(request())
    fake_k8s.delay(2.0, method="GET", times=5)
    started = time.monotonic()
    with pytest.raises(LauncherError, match="did not answer after 2 tries"):
        tj.poll(name)
    assert time.monotonic() - started < 1.5
