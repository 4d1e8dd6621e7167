"""worker.evaluate.run_evaluation on a real DB and local store: the subprocess, stored reports,
and failures that end the row (judge down, deadline, no model). Its lease (claims, the fence,
the reaper) is tested in tests/models/test_evaluations.py and tests/worker."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sqlalchemy import update

from models import jobs as job_states
from models.db import make_engine, make_session_factory
from models.tables import Evaluation, Job
from models.teams import create_team
from storage import open_store
from storage.keys import checkpoint_prefix, job_prefix
from tests.fixtures.rows import add_file
from worker.config import WorkerSettings
from worker.evaluate import _prepare, run_evaluation

REPO = Path(__file__).resolve().parents[2]
MATH = (REPO / "examples" / "data" / "math_eval_small.jsonl").read_bytes()
INSTRUCTION = (REPO / "examples" / "data" / "instruction_eval_small.jsonl").read_bytes()
GEN = {"n": 1, "temperature": 0.0, "max_new_tokens": 4, "seed": 0}


class World:
    def __init__(self, sessions, store, settings, team_id):
        self.sessions, self.store, self.settings, self.team_id = sessions, store, settings, team_id

    def file(self, data: bytes, fmt: str) -> str:
        with self.sessions() as s:
            f = add_file(s, self.store, self.team_id, data, purpose="eval", fmt=fmt)
            s.commit()
            return f.id

    def evaluation(
        self,
        kind: str = "math",
        *,
        data: bytes = MATH,
        job_id=None,
        checkpoint_id=None,
        base_model="tiny-llama",
        **config,
    ) -> str:
        fid = self.file(data, "eval_math" if kind == "math" else "eval_instruction")
        with self.sessions() as s:
            row = Evaluation(
                team_id=self.team_id,
                job_id=job_id,
                checkpoint_id=checkpoint_id,
                base_model=None if job_id else base_model,
                file_id=fid,
                kind=kind,
                config={"generation": GEN, "max_items": 2, **config},
            )
            s.add(row)
            s.commit()
            return row.id

    def row(self, eid: str) -> Evaluation:
        with self.sessions() as s:
            return s.get(Evaluation, eid)

    def run(self, eid: str):
        return run_evaluation(eid, self.sessions, self.store, self.settings)


@pytest.fixture
def world(sqlite_url, tmp_path, monkeypatch) -> World:
    settings = WorkerSettings(
        DATABASE_URL=sqlite_url,
        STORAGE_URL=f"file://{tmp_path / 'objects'}",
        WORKER_DIR=str(tmp_path / "work"),
        LEASE_SECONDS=30,
        HEARTBEAT_SECONDS=0.5,
    )
    sessions = make_session_factory(make_engine(sqlite_url))
    with sessions() as s:
        team = create_team(s, "t")
        s.commit()
        team_id = team.id
    return World(sessions, open_store(settings.STORAGE_URL), settings, team_id)


def test_a_base_model_math_evaluation_succeeds_and_stores_its_report(world):
    eid = world.evaluation()
    assert world.run(eid) == "succeeded"
    row = world.row(eid)
    assert row.status == "succeeded" and row.finished_at is not None and row.error is None
    assert row.result["metrics"]["n_items"] == 2 and "items" not in row.result  # summary only
    keys = row.result["report"]
    assert keys == {
        "json": f"{world.team_id}/{eid}/reports/{eid}.json",
        "html": f"{world.team_id}/{eid}/reports/{eid}.html",
    }
    doc = json.loads(world.store.get_bytes(keys["json"]))
    assert len(doc["items"]) == 2 and doc["evaluation"]["id"] == eid
    assert world.store.get_bytes(keys["html"]).startswith(b"<!DOCTYPE html>")
    assert world.run(eid) is None  # delivered twice: the second is a no-op
    assert not list(
        (Path(world.settings.WORKER_DIR) / "evaluations" / eid).glob("attempt-*")
    )  # cleaned up


def test_a_jobs_final_model_and_checkpoint_are_downloaded_and_evaluated(world, tmp_path):
    import torch
    from safetensors.torch import save_file

    from contract.spec import JobSpec
    from trainer.modeling import (
        load_policy,
        resolve_model,
        save_pretrained_weights,
        trainable_state_dict,
    )
    from trainer.modeling.policy import load_tokenizer

    spec = JobSpec(
        base_model="tiny-llama",
        training_file="x",
        objective="dpo",
        adapter={"kind": "lora", "r": 2},
    )
    torch.manual_seed(0)
    model = load_policy(spec, resolve_model("tiny-llama"))
    save_pretrained_weights(model, load_tokenizer(resolve_model("tiny-llama")), tmp_path / "final")
    (tmp_path / "ckpt").mkdir()
    save_file(
        {k: v.contiguous() for k, v in trainable_state_dict(model).items()},
        tmp_path / "ckpt" / "weights.safetensors",
    )
    (tmp_path / "ckpt" / "spec.json").write_text(spec.model_dump_json())
    with world.sessions() as s:
        job = job_states.create_job(
            s,
            team_id=world.team_id,
            spec=spec.model_dump(mode="json"),
            metadata={},
            training_file_id=None,
        )
        s.flush()
        prefix = job_prefix(world.team_id, job.id) + "final/"
        world.store.upload_dir(prefix, tmp_path / "final")
        ck_prefix = checkpoint_prefix(world.team_id, job.id, 2)
        world.store.upload_dir(ck_prefix, tmp_path / "ckpt")
        ckpt = job_states.add_checkpoint(s, job.id, 2, ck_prefix)
        s.execute(
            update(Job)
            .where(Job.id == job.id)
            .values(status="succeeded", result={"final_model": {"prefix": prefix, "files": []}})
        )
        s.commit()
        job_id, ckpt_id = job.id, ckpt.id
    final_eval = world.evaluation(job_id=job_id)
    step_eval = world.evaluation(job_id=job_id, checkpoint_id=ckpt_id, step=2)
    # What each is evaluated on: the downloaded final/ (peft) or step-2/ (weights + spec).
    for eid, kind, files in (
        (final_eval, "dir", "adapter_config.json"),
        (step_eval, "checkpoint", "spec.json"),
    ):
        work = tmp_path / f"prep-{eid}"
        work.mkdir()
        with world.sessions() as s:
            config, header = _prepare(s, s.get(Evaluation, eid), world.store, world.settings, work)
        # named relative to `work`, the child's working directory: no server path in a report
        assert config["model"]["type"] == kind
        assert (work / config["model"]["path"] / files).is_file()
        assert header["job_id"] == job_id and header["step"] == (
            2 if kind == "checkpoint" else None
        )
    # One full run (the model loading itself is covered in test_run).
    assert world.run(step_eval) == "succeeded"
    assert (
        world.row(step_eval).result["report"]["json"]
        == f"{world.team_id}/{job_id}/reports/{step_eval}.json"
    )


def test_an_unreachable_judge_fails_the_evaluation_quickly_with_a_clear_message(world, monkeypatch):
    world.settings.EVAL_JUDGE_BASE_URLS = "http://127.0.0.1:9/v1"
    world.settings.EVAL_JUDGE_MAX_ATTEMPTS = 2
    world.settings.EVAL_JUDGE_TIMEOUT_SECONDS = 1.0
    world.settings.EVAL_JUDGE_DEADLINE_SECONDS = 3.0
    eid = world.evaluation(
        "instruction",
        data=INSTRUCTION,
        judge={"type": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"},
    )
    t0 = time.monotonic()
    assert world.run(eid) == "failed"
    assert time.monotonic() - t0 < 60
    row = world.row(eid)
    assert row.status == "failed" and row.error["type"] == "judge_error"
    assert "127.0.0.1:9" in row.error["message"] and "connection error" in row.error["message"]


def test_a_judge_endpoint_no_longer_allowed_is_refused(world):
    eid = world.evaluation(
        "instruction",
        data=INSTRUCTION,
        judge={"type": "openai", "base_url": "http://evil.example/v1", "model": "m"},
    )
    assert world.run(eid) == "failed"
    assert world.row(eid).error["type"] == "invalid_evaluation"


def test_the_deadline_kills_a_long_evaluation(world, monkeypatch):
    world.settings.EVAL_TIMEOUT_SECONDS = 1.0
    eid = world.evaluation()
    t0 = time.monotonic()
    assert world.run(eid) == "failed"
    assert time.monotonic() - t0 < 20
    error = world.row(eid).error
    assert error["type"] == "timeout" and "EVAL_TIMEOUT_SECONDS" in error["message"]


def test_a_job_without_a_final_model_fails_without_running(world):
    with world.sessions() as s:
        job = job_states.create_job(
            s,
            team_id=world.team_id,
            spec={"base_model": "tiny-llama"},
            metadata={},
            training_file_id=None,
        )
        s.commit()
        job_id = job.id
    eid = world.evaluation(job_id=job_id)
    assert world.run(eid) == "failed"
    assert world.row(eid).error["type"] == "missing_model"


def test_a_worker_shutdown_gives_the_evaluation_back(world):
    """The leased attempt's shutdown path, as a job's: back to `queued` and sent again."""
    eid = world.evaluation()
    sent: list[str] = []
    outcome = run_evaluation(
        eid, world.sessions, world.store, world.settings, send=sent.append, should_stop=lambda: True
    )
    assert outcome == "released" and sent == [eid]
    row = world.row(eid)
    assert row.status == "queued" and row.lease_owner is None and row.attempt == 1
