"""POST /v1/jobs/estimate (issue 27 item 4): the same body and 4xx as create, nothing written,
figures by hand for a known file, and the estimate kept with the job that create makes."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from api.estimates import host_memory_bytes
from contract.memory import GiB
from models.settings import Settings
from models.tables import Job, JobEvent
from tests.api.conftest import PREFERENCE, create_job, job_body

# PREFERENCE: 4 records, 220 bytes (55 a record). tiny-llama's row, by hand
# (contract/throughput.json: 1.85 bytes per token, 2 template tokens a row; a preference row
# holds the prompt and one of two completions, 2/3 of a record): 2 + 55 × 2/3 ÷ 1.85 = 21.8 → 22.
assert len(PREFERENCE) == 220
ROW = 22


def _rows(db_sessions) -> tuple[int, int]:
    with db_sessions() as s:
        jobs = s.execute(select(func.count()).select_from(Job)).scalar_one()
        events = s.execute(select(func.count()).select_from(JobEvent)).scalar_one()
        return jobs, events


def test_estimate_by_hand_and_nothing_written(client, team_a, train_file, db_sessions):
    before = _rows(db_sessions)
    r = client.post(
        "/v1/jobs/estimate", headers=team_a.headers, json=job_body(train_file, epochs=3)
    )
    assert r.status_code == 200, r.text
    est = r.json()
    assert est["object"] == "job.estimate"
    assert est["steps"] == 3  # 4 pairs ÷ batch 4 = 1 step an epoch, 3 epochs
    assert est["examples"] == 4
    assert est["tokens_per_step"] == 8 * ROW  # 4 pairs = 8 rows
    assert est["tokens"] == 3 * 8 * ROW
    assert "approximated" in est["tokens_method"]
    # the resolved spec, as create would store it
    assert est["spec"]["batch_size"] == 4 and est["spec"]["optim"]["lr"] is not None
    assert est["spec"]["reference_sync"] == "none"
    # the default queue is a CPU one: one process, no GPU, this machine's memory (not the cap)
    assert est["device"] == "cpu" and est["processes"] == 1 and est["gpus"] == 0
    assert est["gpu_hours"] == 0
    here = min(host_memory_bytes(), 512 * GiB) / GiB
    assert est["memory_available_gib"] == pytest.approx(here, abs=1e-3)
    assert est["micro_batch"] * est["grad_accum"] == 4  # the whole batch, one process
    assert est["memory_fits"] and 0.5 < est["memory_gib_per_process"] < 2
    assert est["wall_clock_seconds"] == pytest.approx(
        est["startup_seconds"] + est["tokenize_seconds"] + est["train_seconds"]
        + est["sampling_seconds"], abs=1e-3,
    )  # fmt: skip
    assert est["train_seconds"] > 0 and est["sampling_share"] == 0
    assert _rows(db_sessions) == before  # no job, no event


def test_another_teams_file_is_not_found(client, team_b, train_file):
    r = client.post("/v1/jobs/estimate", headers=team_b.headers, json=job_body(train_file))
    assert r.status_code == 404 and r.json()["error"]["field"] == "training_file"


def test_same_4xx_as_create(client, team_a, train_file, db_sessions):
    bad = [
        ({"base_model": "gpt-9"}, 422, "base_model"),
        ({"max_steps": 2_000_000_000}, 422, "max_steps"),
        ({"batch_size": 8}, 422, "batch_size"),  # more pairs per step than the file has
        ({"training_file": "file-nope"}, 404, "training_file"),
        ({"objective": "kto", "humanline_params": {"clip": 3}}, 422, None),  # pydantic's 422
    ]
    for overrides, status, field in bad:
        body = job_body(train_file, **overrides)
        created = client.post("/v1/jobs", headers=team_a.headers, json=body)
        estimated = client.post("/v1/jobs/estimate", headers=team_a.headers, json=body)
        assert created.status_code == estimated.status_code == status, (overrides, created.text)
        assert created.json()["error"]["message"] == estimated.json()["error"]["message"]
        if field:
            assert estimated.json()["error"]["field"] == field
    assert _rows(db_sessions) == (0, 0)
    other = client.post("/v1/jobs/estimate", json=job_body(train_file))  # no key
    assert other.status_code == 401


def test_a_job_keeps_its_estimate(client, team_a, train_file):
    estimated = client.post(
        "/v1/jobs/estimate", headers=team_a.headers, json=job_body(train_file)
    ).json()
    job = create_job(client, team_a, train_file)
    assert job["estimate"]["steps"] == 1 and job["estimate"]["tokens"] == 8 * ROW
    got = client.get(f"/v1/jobs/{job['id']}", headers=team_a.headers).json()
    assert got["estimate"] == job["estimate"]
    for key in ("steps", "tokens", "micro_batch", "grad_accum", "wall_clock_seconds"):
        assert got["estimate"][key] == estimated[key]
    events = client.get(f"/v1/jobs/{job['id']}/events", headers=team_a.headers).json()["data"]
    assert events[0]["kind"] == "created" and events[0]["data"]["estimate"] == job["estimate"]
    listed = client.get("/v1/jobs", headers=team_a.headers).json()["data"]
    assert listed[0]["estimate"] is None  # lists do not read events


@pytest.fixture
def gpu_settings(settings) -> Settings:
    return settings.model_copy(
        update={"JOB_DEVICE_KIND": "h100", "JOB_PROCESSES": 2, "CAP_TRAIN_MEMORY_GIB": 40.0}
    )


def test_a_gpu_queue_prices_gpus_and_its_memory(gpu_settings, store, queue, db_sessions, team_a):
    from fastapi.testclient import TestClient

    from api.main import create_app
    from tests.api.conftest import upload

    client = TestClient(
        create_app(gpu_settings, store=store, queue=queue, session_factory=db_sessions)
    )
    file_id = upload(client, team_a).json()["id"]
    est = client.post(
        "/v1/jobs/estimate", headers=team_a.headers, json=job_body(file_id, max_steps=10)
    ).json()
    assert est["device"] == "h100" and est["gpus"] == 2 and est["processes"] == 2
    assert est["memory_available_gib"] == 40.0  # the cap, below the H100's 80 GiB
    assert est["micro_batch"] * est["grad_accum"] == 2  # 4 pairs over 2 processes
    assert est["steps"] == 10
    assert est["gpu_hours"] == pytest.approx(est["wall_clock_seconds"] * 2 / 3600, rel=1e-3)
    # a batch that does not split over the queue's processes: 422, not a 500
    odd = client.post(
        "/v1/jobs/estimate",
        headers=team_a.headers,
        json=job_body(file_id, batch_size=3, max_steps=1),
    )
    assert odd.status_code == 422 and odd.json()["error"]["field"] == "batch_size"


def test_several_nodes_price_every_gpu(gpu_settings, store, queue, db_sessions, team_a):
    """nodes × processes_per_node GPUs, not the queue's JOB_PROCESSES (2)."""
    from fastapi.testclient import TestClient

    from api.main import create_app
    from tests.api.conftest import upload

    settings = gpu_settings.model_copy(update={"MULTINODE_LAUNCHER": "trainjob"})
    client = TestClient(create_app(settings, store=store, queue=queue, session_factory=db_sessions))
    file_id = upload(client, team_a).json()["id"]
    two = {"nodes": 2, "processes_per_node": 2, "strategy": "fsdp", "hsdp": True}
    body = job_body(file_id, max_steps=10, parallelism=two)
    est = client.post("/v1/jobs/estimate", headers=team_a.headers, json=body).json()
    assert est["gpus"] == 4 and est["processes"] == 4, est
    assert est["micro_batch"] * est["grad_accum"] == 1  # 4 pairs over 4 processes
    assert est["gpu_hours"] == pytest.approx(est["wall_clock_seconds"] * 4 / 3600, rel=1e-3)


def test_the_jobs_report_shows_its_estimate(client, team_a, train_file):
    job = create_job(client, team_a, train_file)
    report = client.get(f"/v1/jobs/{job['id']}/report", headers=team_a.headers).json()
    rows = {r["figure"]: r for r in report["estimate"]["rows"]}
    assert rows["optimizer steps"]["predicted"] == 1
    assert rows["training tokens"]["predicted"] == 8 * ROW
    html = client.get(
        f"/v1/jobs/{job['id']}/report", headers=team_a.headers, params={"format": "html"}
    ).text
    assert "Estimate vs actual" in html


def _estimate_app(settings, store, queue, db_sessions, team_a, **body):
    from fastapi.testclient import TestClient

    from api.main import create_app
    from tests.api.conftest import upload

    client = TestClient(create_app(settings, store=store, queue=queue, session_factory=db_sessions))
    file_id = upload(client, team_a).json()["id"]
    return client.post(
        "/v1/jobs/estimate", headers=team_a.headers, json=job_body(file_id, **body)
    ).json()


def test_the_estimate_prices_the_queues_worker_memory_not_the_cap(
    settings, store, queue, db_sessions, team_a, monkeypatch
):
    """Issue 38: on a 24 GiB machine the embedded default printed "512 GiB per process" (the
    operator cap). The queue's worker class has JOB_MEMORY_GIB, or unset, on a CPU queue, this
    machine's memory ÷ its processes; the micro-batch is the one the trainer chooses there."""
    import api.estimates
    from contract.micro_batch import choose_micro_batch
    from contract.shapes import BUILTIN_SHAPES, TINY_LLAMA

    monkeypatch.setattr(api.estimates, "host_memory_bytes", lambda: 24 * GiB)
    est = _estimate_app(settings, store, queue, db_sessions, team_a, max_steps=2)
    assert est["memory_available_gib"] == pytest.approx(24.0)
    two = settings.model_copy(update={"JOB_PROCESSES": 2})
    est = _estimate_app(two, store, queue, db_sessions, team_a, max_steps=2)
    assert est["memory_available_gib"] == pytest.approx(12.0)
    # set per queue: a worker class of 1 GiB; below the cap it is what is priced
    small = settings.model_copy(update={"JOB_MEMORY_GIB": 0.6})
    est = _estimate_app(small, store, queue, db_sessions, team_a, max_steps=2)
    assert est["memory_available_gib"] == pytest.approx(0.6)
    # the micro-batch the trainer would choose with 0.6 GiB
    choice = choose_micro_batch(
        _resolved(est), BUILTIN_SHAPES[TINY_LLAMA], int(0.6 * GiB), training_file_bytes=220,
        training_records=4,
    )  # fmt: skip
    assert (est["micro_batch"], est["grad_accum"]) == (choice.micro_examples, choice.grad_accum)
    # never above the operator's cap, which bounds what any job may use
    capped = settings.model_copy(update={"JOB_MEMORY_GIB": 64.0, "CAP_TRAIN_MEMORY_GIB": 40.0})
    est = _estimate_app(capped, store, queue, db_sessions, team_a, max_steps=2)
    assert est["memory_available_gib"] == pytest.approx(40.0)
    # a GPU queue unset: the device's memory (an H100's 80), not the cap's 512
    h100 = settings.model_copy(update={"JOB_DEVICE_KIND": "h100"})
    est = _estimate_app(h100, store, queue, db_sessions, team_a, max_steps=2)
    assert est["memory_available_gib"] == pytest.approx(80.0)


def _resolved(est: dict):
    from contract.spec import JobSpec

    return JobSpec.model_validate(est["spec"])
