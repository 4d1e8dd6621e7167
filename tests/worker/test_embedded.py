"""The embedded default (BROKER_URL=memory://): the API hands jobs to a thread of its own
process; SQLite and a local store, nothing else."""

from __future__ import annotations

from tests.fixtures.services import wait_job_done
from tests.worker.conftest import PREFERENCE, TINY, checkpoint_steps, metric_steps, wait_for
from worker import embedded


def test_embedded_worker_runs_stops_and_resumes_a_job(local, api):
    assert local.settings.embedded_worker
    embedded.start(local.settings)
    file_id = api.post(
        "/v1/files",
        files={"file": ("train.jsonl", PREFERENCE, "application/jsonl")},
        data={"purpose": "train"},
    ).json()["id"]
    # Enough steps that the stop always lands mid-run (tiny steps take ~20 ms on a quiet machine).
    steps = 400
    r = api.post("/v1/jobs", json={**TINY, "training_file": file_id, "max_steps": steps})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    wait_for(lambda: len(metric_steps(local.sessions, job_id)) >= 2, 60, what="training")

    # Shutting the server down: the trainer checkpoints, the job goes back to the queue.
    embedded.stop()
    job = api.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "queued", job
    stopped_at = checkpoint_steps(local.sessions, job_id)
    assert len(stopped_at) == 1 and 2 <= stopped_at[0] < steps

    # The next start picks the queued job up and resumes it from that checkpoint.
    embedded.start(local.settings)

    # A job that keeps stepping is not stuck: fail when it makes no progress for 120 s (or
    # after 900 s in all), not when a loaded machine makes its 400 steps slow.
    job = wait_job_done(lambda: api.get(f"/v1/jobs/{job_id}").json(), 120, 900)
    assert job["status"] == "succeeded", job["error"]
    assert job["attempt"] == 2
    kinds = [
        e["kind"]
        for e in api.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    ]
    assert kinds.count("started") == 2 and kinds.count("resumed") == 1 and "stopped" in kinds
    assert metric_steps(local.sessions, job_id) == list(range(1, steps + 1))
    assert checkpoint_steps(local.sessions, job_id) == [stopped_at[0], steps]
    objects = local.store.list("")
    assert any(k.endswith(f"{job_id}/final/model.safetensors") for k in objects)
    assert any(k.endswith(f"{job_id}/step-{steps}/_COMPLETE") for k in objects)


def test_enqueue_before_start_waits_for_the_worker(local):
    job_id = local.make_job(max_steps=2)
    for key in local.store.list(""):  # the job fails fast (no trainer) once it is run
        local.store.delete(key)
    embedded.enqueue(job_id)
    assert local.job(job_id).status == "queued"  # nothing runs before start()
    worker = embedded.start(local.settings)
    try:
        assert embedded.start(local.settings) is worker  # one per process
        wait_for(lambda: local.job(job_id).status == "failed", 30, 0.1, "the job to run")
        assert local.job(job_id).error["type"] == "missing_file"
    finally:
        embedded.stop()


def test_a_training_file_with_a_utf8_bom_is_accepted_and_trained_on(local, api):
    """The API and the trainer validate with one validator: a file the API accepts (a BOM
    before the first line, CRLF line ends: what Windows editors write) trains. Before they
    shared it, the upload succeeded and the job failed with `Unexpected UTF-8 BOM`."""
    embedded.start(local.settings)
    data = b"\xef\xbb\xbf" + PREFERENCE.replace(b"\n", b"\r\n")
    r = api.post(
        "/v1/files",
        files={"file": ("train.jsonl", data, "application/jsonl")},
        data={"purpose": "train"},
    )
    assert r.status_code == 201, r.text
    assert r.json()["records"] == PREFERENCE.count(b"\n")
    r = api.post("/v1/jobs", json={**TINY, "training_file": r.json()["id"], "max_steps": 2})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]

    def done():
        status = api.get(f"/v1/jobs/{job_id}").json()
        return status if status["status"] in ("succeeded", "failed", "cancelled") else None

    job = wait_for(done, 120, 0.2, "the job to finish")
    assert job["status"] == "succeeded", job["error"]
    assert metric_steps(local.sessions, job_id) == [1, 2]
