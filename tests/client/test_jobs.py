"""client.jobs against the real API; job progress is driven through models.jobs as a worker
would (there is no worker in these tests)."""

from __future__ import annotations

import io
import time

import pytest

from humanline_client import (
    Checkpoint,
    ConflictError,
    Job,
    JobEvent,
    JobEventStream,
    JobTraining,
    JobWaitTimeout,
    Metric,
    NotFoundError,
    UnprocessableEntityError,
)
from humanline_client._progress import make_progress

from .conftest import MAX_JOBS_PER_TEAM


def create(client, train_file, **kwargs) -> Job:
    kwargs.setdefault("base_model", "tiny-llama")
    kwargs.setdefault("objective", "dpo")
    kwargs.setdefault("batch_size", 8)  # the 8-pair file (a larger default adds a warning event)
    return client.jobs.create(training_file=train_file, **kwargs)


def test_create_sends_only_what_is_set_and_the_server_fills_defaults(client, train_file):
    job = create(
        client,
        train_file,
        objective={"name": "dpo", "beta": 0.2},
        variant="offline+humanline",
        humanline_params={"sync_every": 2, "log_eps_P": -1.0, "log_eps_R": 1.0},
        optim={"lr": 1e-6},
        batch_size=4,
        max_steps=10,
        seed=7,
        metadata={"experiment": "sdk"},
    )
    assert isinstance(job, Job) and job.status == "queued" and not job.is_terminal
    assert (job.objective, job.variant, job.training_file) == (
        "dpo",
        "offline+humanline",
        train_file,
    )
    assert job.metadata == {"experiment": "sdk"}
    assert job.spec["objective"]["beta"] == 0.2 and job.spec["humanline"] is True
    assert job.spec["humanline_params"]["sync_every"] == 2
    assert job.spec["optim"]["lr"] == 1e-6 and job.spec["optim"]["eps"] == 1e-5  # default kept
    assert job.spec["max_steps"] == 10 and job.spec["seed"] == 7


def test_create_extra_body_and_spec_errors(client, train_file):
    job = create(client, train_file, objective="kto", extra_body={"epochs": 2})
    assert job.spec["epochs"] == 2 and job.objective == "kto"
    with pytest.raises(UnprocessableEntityError) as info:
        create(client, train_file, extra_body={"no_such_field": 1})
    assert info.value.field == "no_such_field" and info.value.errors
    with pytest.raises(UnprocessableEntityError) as info:
        create(client, train_file, base_model="gpt-5")
    assert info.value.field == "base_model"
    with pytest.raises(UnprocessableEntityError, match="reference"):
        create(
            client,
            train_file,
            variant="offline+humanline",
            objective={"name": "dpo", "reference_free": True},
        )


def test_list_pages_lazily_and_filters(client, train_file):
    jobs = [create(client, train_file, metadata={"i": str(i), "sweep": "a"}) for i in range(5)]
    listing = client.jobs.list(limit=2)
    assert [len(p.data) for p in listing.pages()] == [2, 2, 1]
    assert [j.id for j in listing] == [j.id for j in reversed(jobs)]
    first = listing.first_page()
    assert first.has_more and first.next_page().data[0].id == jobs[2].id
    assert [j.id for j in client.jobs.list(metadata={"i": "3"})] == [jobs[3].id]
    assert len(client.jobs.list(metadata={"sweep": "a"}, limit=1).to_list()) == 5
    client.jobs.cancel(jobs[0].id)
    assert [j.id for j in client.jobs.list(status="cancelled")] == [jobs[0].id]
    assert len(list(client.jobs.list(status="queued"))) == 4


def test_retrieve_and_cancel(client, train_file, driver):
    queued = create(client, train_file)
    assert client.jobs.retrieve(queued.id).id == queued.id
    cancelled = client.jobs.cancel(queued.id)
    assert cancelled.status == "cancelled" and cancelled.is_terminal
    with pytest.raises(ConflictError) as info:
        client.jobs.cancel(queued.id)
    assert info.value.field == "job_id"

    running = create(client, train_file)
    driver.start(running.id, total_steps=5)
    assert client.jobs.retrieve(running.id).training is None  # the trainer has not started
    driver.event(running.id, "started", "go", grad_accum=2, micro_batch=4, compile=False)
    training = client.jobs.retrieve(running.id).training
    assert isinstance(training, JobTraining)
    assert (training.grad_accum, training.micro_batch, training.compile) == (2, 4, False)
    assert client.jobs.cancel(running.id).status == "cancelling"
    assert client.jobs.cancel(running.id).status == "cancelling"  # repeating is fine
    with pytest.raises(NotFoundError):
        client.jobs.retrieve("job-does-not-exist")
    with pytest.raises(NotFoundError):  # a slash cannot reach another route
        client.jobs.retrieve("../files")


def test_events_metrics_checkpoints_and_download(client, train_file, driver, tmp_path):
    job = create(client, train_file)
    driver.start(job.id, total_steps=5)
    for step in range(1, 6):
        driver.step(job.id, step, loss=1.0 / step, clip_fraction=0.05 * step)
    driver.checkpoint(job.id, 3, {"adapter_model.safetensors": b"abc", "config.json": b"{}"})
    driver.checkpoint(job.id, 5, {"adapter_model.safetensors": b"final-weights"})
    driver.finish(job.id, final_step=5)

    events = client.jobs.events(job.id, limit=2)
    pages = list(events.pages())
    assert len(pages) == 3 and pages[0].first_id == 1  # created, queued, running, 2 ckpts, done
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, 7))
    assert all(isinstance(e, JobEvent) for e in events)
    assert [e.seq for e in client.jobs.events(job.id, after=4)] == [5, 6]
    kinds = [e.kind for e in events]
    assert kinds[0] == "created" and kinds[-1] == "status" and kinds.count("checkpoint") == 2

    metrics = client.jobs.metrics(job.id, limit=2)
    assert [m.step for m in metrics] == [1, 2, 3, 4, 5]  # three pages, by from_step
    assert [len(p.data) for p in metrics.pages()] == [2, 2, 1]
    assert isinstance(metrics.first_page()[0], Metric)
    window = client.jobs.metrics(job.id, from_step=2, to_step=3).to_list()
    assert [(m.step, m.get("loss")) for m in window] == [(2, 0.5), (3, 1.0 / 3)]

    checkpoints = list(client.jobs.checkpoints(job.id))
    assert [c.step for c in checkpoints] == [3, 5] and isinstance(checkpoints[0], Checkpoint)
    assert checkpoints[0].files == ["adapter_model.safetensors", "config.json"]
    data = client.jobs.download_checkpoint(job.id, step=5, file="adapter_model.safetensors")
    assert data == b"final-weights"
    dest = client.jobs.download_checkpoint(
        job.id, step=3, file="config.json", to=tmp_path / "c.json"
    )
    assert dest.read_bytes() == b"{}"
    with pytest.raises(NotFoundError) as info:
        client.jobs.download_checkpoint(job.id, step=3, file="../../secrets")
    assert info.value.field == "file"
    with pytest.raises(NotFoundError):
        client.jobs.download_checkpoint(job.id, step=4, file="config.json")

    finished = client.jobs.retrieve(job.id)
    assert finished.status == "succeeded" and finished.result == {"final_step": 5}
    assert (finished.current_step, finished.total_steps) == (5, 5)


def test_stream_events_follows_the_job_to_its_end(client, train_file, driver):
    job = create(client, train_file)
    worker = driver.in_background(driver.run, job.id, 3, 0.05)
    with client.jobs.stream_events(job.id) as stream:
        assert isinstance(stream, JobEventStream)
        events = list(stream)
    worker.join()
    assert stream.status == "succeeded" and stream.reconnects == 0
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[-1].data["to"] == "succeeded"
    # resuming from a seq skips what was seen
    assert [e.seq for e in client.jobs.stream_events(job.id, after=3)] == [
        e.seq for e in events if e.seq > 3
    ]


@pytest.mark.parametrize("fault", ["cut", "drop"])
def test_stream_reconnects_with_last_event_id(server, client, train_file, driver, fault):
    """The first connection ends after two events (cleanly, or broken mid-stream); the stream
    reconnects with Last-Event-ID and delivers every event exactly once."""
    job = create(client, train_file)
    driver.start(job.id, total_steps=2)
    driver.event(job.id, "log", "warming up")
    token = server.faults.plan((fault, 3))  # chunks: "retry:", event 1, event 2
    faulty = client.with_options(default_headers={"X-Test-Fault": token})
    worker = driver.in_background(lambda: (time.sleep(0.3), driver.finish(job.id)))
    stream = faulty.jobs.stream_events(job.id)
    seqs = [e.seq for e in stream]
    worker.join()
    assert seqs == list(range(1, 6)) and stream.status == "succeeded"
    assert stream.reconnects == 1
    seen = server.faults.seen[token]
    assert len(seen) == 2 and "last-event-id" not in seen[0]
    assert seen[1]["last-event-id"] == "2"


def test_wait_returns_the_final_job_and_reports_events(client, train_file, driver):
    job = create(client, train_file)
    worker = driver.in_background(driver.run, job.id, 4, 0.05)
    seen: list[JobEvent] = []
    final = client.jobs.wait(job.id, on_event=seen.append, progress=False)
    worker.join()
    assert final.status == "succeeded" and final.finished_at is not None
    assert seen[0].kind == "created" and seen[-1].data["to"] == "succeeded"
    # a finished job returns at once, replaying its events to on_event
    again: list[JobEvent] = []
    assert client.jobs.wait(job.id, on_event=again.append).status == "succeeded"
    assert [e.seq for e in again] == [e.seq for e in seen]


def test_wait_for_a_failed_or_cancelled_job(client, train_file, driver):
    failed = create(client, train_file)
    driver.start(failed.id)
    driver.in_background(lambda: (time.sleep(0.2), driver.finish(failed.id, "failed")))
    assert client.jobs.wait(failed.id).status == "failed"
    queued = create(client, train_file)
    driver.in_background(lambda: (time.sleep(0.2), client.jobs.cancel(queued.id)))
    assert client.jobs.wait(queued.id).status == "cancelled"


def test_wait_timeout(client, train_file):
    job = create(client, train_file)
    started = time.monotonic()
    with pytest.raises(JobWaitTimeout) as info:
        client.jobs.wait(job.id, timeout=0.5)
    assert 0.4 < time.monotonic() - started < 5
    assert info.value.job.id == job.id and info.value.job.status == "queued"
    assert isinstance(info.value, TimeoutError)


@pytest.mark.parametrize("kind", ["rich", "tqdm", "plain"])
def test_wait_progress_shows_steps_loss_and_eta(client, train_file, driver, monkeypatch, kind):
    job = create(client, train_file)
    out = io.StringIO()
    import humanline_client.resources._job_wait as jobs_module

    monkeypatch.setattr(
        jobs_module,
        "make_progress",
        lambda enabled, job_id: make_progress(enabled, job_id, file=out, kind=kind),
    )
    worker = driver.in_background(driver.run, job.id, 4, 0.05)
    final = client.jobs.wait(job.id, progress=True, poll_interval=0.05)
    worker.join()
    assert final.status == "succeeded"
    text = out.getvalue()
    assert "4/4" in text and "0.175" in text  # the last step and its loss (0.7 / 4)
    assert "ETA" in text or "<" in text  # tqdm writes its ETA as [elapsed<remaining]
    assert "status: running → succeeded" in text


def test_progress_is_off_when_not_a_terminal():
    assert make_progress(None, "job-x", file=io.StringIO()) is None
    assert make_progress(False, "job-x") is None


def test_quota_of_active_jobs_is_a_rate_limit_error(server, client, train_file):
    from humanline_client import RateLimitError

    for _ in range(MAX_JOBS_PER_TEAM):
        create(client, train_file)
    with pytest.raises(RateLimitError) as info:
        client.with_options(max_retries=0).jobs.create(
            base_model="tiny-llama", training_file=train_file, objective="dpo"
        )
    assert info.value.status_code == 429 and "active jobs" in info.value.message


def test_stream_of_a_missing_job_raises_at_once(client):
    with pytest.raises(NotFoundError):
        list(client.jobs.stream_events("job-nope"))
    with pytest.raises(NotFoundError):
        client.jobs.wait("job-nope")


def test_models_tolerate_what_a_newer_server_adds():
    job = Job.model_validate(
        {
            "id": "job-1",
            "status": "paused",  # a status this SDK does not know
            "objective": "ppo",
            "priority": 3,  # a field it does not know
            "created_at": "2026-01-01T00:00:00Z",
        }
    )
    assert job.status == "paused" and not job.is_terminal and job.priority == 3
    assert job.model_extra == {"priority": 3} and job.to_dict()["priority"] == 3
    assert Job.model_validate({"id": "job-2", "status": "succeeded"}).is_terminal
    event = JobEvent.model_validate({"seq": 1, "kind": "reward_model", "extra": [1]})
    assert event.kind == "reward_model" and event.extra == [1]


def test_presigned_checkpoint_redirect_is_followed_without_the_api_key(
    server, client, train_file, driver, tmp_path
):
    """On S3 the API answers 307 to a presigned URL; the SDK follows it without sending the
    Authorization header to the object store."""
    job = create(client, train_file)
    driver.start(job.id)
    driver.checkpoint(job.id, 1, {"weights.safetensors": b"presigned-bytes"})
    server.store.presign_jobs.add(job.id)
    before = len(server.store.object_requests)
    assert client.jobs.download_checkpoint(job.id, step=1, file="weights.safetensors") == (
        b"presigned-bytes"
    )
    dest = client.jobs.download_checkpoint(
        job.id, step=1, file="weights.safetensors", to=tmp_path / "w.safetensors"
    )
    assert dest.read_bytes() == b"presigned-bytes"
    seen = server.store.object_requests[before:]
    assert len(seen) == 2 and all("authorization" not in h for h in seen)
