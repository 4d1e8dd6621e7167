"""`client.jobs.estimate` (sync and async) and `humanline jobs estimate SPEC.yaml` against the
real server (issue 27 item 4)."""

from __future__ import annotations

import asyncio
import inspect
import json

import pytest

from humanline_client import AsyncClient, JobEstimate, UnprocessableEntityError
from humanline_client.resources.jobs import _Jobs

from .conftest import PREFERENCE

# PREFERENCE: 8 pairs, 539 bytes (67.4 a record). A tiny-llama row, by hand (contract/
# throughput.json: 1.85 bytes a token, 2 template tokens a row, a preference row 2/3 of its
# record): 2 + 67.375 × 2/3 ÷ 1.85 = 26.3 → 26 tokens; batch 8 pairs = 16 rows a step.
assert len(PREFERENCE) == 539
ROW = 26


def test_estimate_then_create_keeps_it(client, train_file):
    jobs_before = len(client.jobs.list().first_page().data)
    est = client.jobs.estimate(
        base_model="tiny-llama", training_file=train_file, objective="dpo", batch_size=8,
        epochs=2,
    )  # fmt: skip
    assert isinstance(est, JobEstimate)
    assert est.steps == 2 and est.examples == 8
    assert est.tokens_per_step == 16 * ROW and est.tokens == 2 * 16 * ROW
    assert est.spec["batch_size"] == 8 and est.spec["epochs"] == 2
    assert est.device == "cpu" and est.gpus == 0 and est.wall_clock_seconds > 0
    assert len(client.jobs.list().first_page().data) == jobs_before  # nothing created

    job = client.jobs.create(
        base_model="tiny-llama", training_file=train_file, objective="dpo", batch_size=8,
        epochs=2,
    )  # fmt: skip
    assert job.estimate is not None and job.estimate.tokens == est.tokens
    again = client.jobs.retrieve(job.id)
    assert again.estimate is not None and again.estimate.steps == 2


def test_estimate_errors_are_creates(client, train_file):
    kwargs = {"base_model": "tiny-llama", "training_file": train_file, "objective": "dpo"}
    with pytest.raises(UnprocessableEntityError) as created:
        client.jobs.create(**kwargs, batch_size=64)
    with pytest.raises(UnprocessableEntityError) as estimated:
        client.jobs.estimate(**kwargs, batch_size=64)
    assert created.value.message == estimated.value.message
    assert "batch_size" in str(estimated.value)


def test_estimate_takes_creates_keywords():
    create = inspect.signature(_Jobs.create.steps).parameters
    estimate = inspect.signature(_Jobs.estimate.steps).parameters
    assert list(estimate) == [p for p in create if p != "idempotency_key"]


def test_estimate_async(aclient_args, train_file):
    async def go() -> JobEstimate:
        async with AsyncClient(**aclient_args) as client:
            return await client.jobs.estimate(
                base_model="tiny-llama", training_file=train_file, objective="dpo", batch_size=8
            )

    est = asyncio.run(go())
    assert est.steps == 1 and est.tokens == 16 * ROW


def test_cli_estimate_spec_file(cli, train_file, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"base_model: tiny-llama\ntraining_file: {train_file}\nobjective: dpo\n"
        "batch_size: 8\nepochs: 3\n"
    )
    as_json = json.loads(cli("jobs", "estimate", str(spec), "--json").stdout)
    assert as_json["steps"] == 3 and as_json["tokens"] == 3 * 16 * ROW
    human = cli("jobs", "estimate", str(spec), "--set", "epochs=1").stdout
    assert "steps" in human and f"{16 * ROW:,}" in human and "wall-clock" in human
    assert "approximated" in human
    bad = cli("jobs", "estimate", str(spec), "--set", "batch_size=64", ok=False)
    assert bad.exit_code == 1 and "batch_size" in bad.stderr
