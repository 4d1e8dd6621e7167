"""client.evaluations and `humanline evals` against the real API (tests/client/conftest.py's
server). No worker runs: the API's evaluation queue is replaced by a recording one, and
evaluations are moved through their states (and their stored reports written) directly in the
DB and the object store, as worker/evaluate.py would (`evals`, an EvalDriver).

Fixtures: eval_env and eval_queue (both autouse), evals, auto_eval, math_file, instruction_file.
Helpers: math(client, file_id, ...) creates a math evaluation; finished_job(...) a job to
evaluate."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from sqlalchemy import update

from humanline_client import Evaluation
from models.base import utcnow
from models.tables import Evaluation as EvaluationRow
from storage.keys import job_prefix, report_key
from worker.evaluate import SUMMARY_KEYS

from ..conftest import HookQueue, jsonl

JUDGE_URL = "http://judge.internal:8000/v1"
JUDGE = {"type": "openai", "base_url": JUDGE_URL, "model": "gpt-4.1"}
EVAL_MATH = jsonl([{"problem": f"{i}+{i}?", "answer": str(2 * i)} for i in range(4)])
EVAL_INSTRUCTION = jsonl([{"instruction": f"Say {i}.", "output": f"{i}."} for i in range(3)])
REPORT_DOC = {
    "kind": "math",
    "metrics": {"pass_at_1": {"value": 0.5, "se": 0.1, "n": 4}, "pass_at_n": 0.75},
    "items": [{"problem": "0+0?", "correct": [True]}, {"problem": "1+1?", "correct": [False]}],
    "generation": {"n": 4, "temperature": 0.7, "engine": "hf", "device": "cuda"},
    "timing": {"generate_s": 1.5},
}
REPORT_HTML = b"<!DOCTYPE html><html><body><h1>evaluation report</h1></body></html>"


# --- the evaluation "worker" ---------------------------------------------------------------------


@pytest.fixture(autouse=True)
def eval_env(server, monkeypatch):
    """The operator's judge settings (fields of the server's Settings)."""
    monkeypatch.setattr(server.settings, "EVAL_JUDGE_BASE_URLS", f"{JUDGE_URL}, http://other:1/v1")
    monkeypatch.setattr(server.settings, "EVAL_REWARD_MODELS", "armorm=/models/armorm")


@pytest.fixture(autouse=True)
def eval_queue(server):
    """Every test here: evaluations go to a recording queue, never to a worker."""
    state = server.faults.app.state
    before = getattr(state, "eval_queue", None)
    state.eval_queue = HookQueue()
    yield state.eval_queue
    state.eval_queue = before


class EvalDriver:
    """Moves evaluations through their states in the DB and stores their reports."""

    def __init__(self, server) -> None:
        self.server = server

    def set(self, evaluation_id: str, **values: Any) -> None:
        with self.server.sessions() as s:
            s.execute(
                update(EvaluationRow)
                .where(EvaluationRow.id == evaluation_id)
                .values(updated_at=utcnow(), **values)
            )
            s.commit()

    def start(self, evaluation_id: str, done: int = 0, total: int = 4) -> None:
        progress = {"phase": "generating", "done": done, "total": total}
        self.set(evaluation_id, status="running", result={"progress": progress})

    def succeed(
        self,
        evaluation_id: str,
        doc: dict[str, Any] | None = None,
        html: bytes = REPORT_HTML,
    ) -> None:
        doc = REPORT_DOC if doc is None else doc
        with self.server.sessions() as s:
            row = s.get(EvaluationRow, evaluation_id)
            owner = row.job_id or row.id
            keys = {
                "json": report_key(row.team_id, owner, f"{row.id}.json"),
                "html": report_key(row.team_id, owner, f"{row.id}.html"),
            }
        self.server.store.put_bytes(keys["json"], json.dumps(doc).encode())
        self.server.store.put_bytes(keys["html"], html)
        summary = {k: doc[k] for k in SUMMARY_KEYS if k in doc} | {"report": keys}  # the worker's
        self.set(evaluation_id, status="succeeded", result=summary, finished_at=utcnow())

    def fail(self, evaluation_id: str, message: str = "the judge is unreachable") -> None:
        error = {"type": "judge_error", "message": message}
        self.set(evaluation_id, status="failed", error=error, finished_at=utcnow())

    def run(self, evaluation_id: str, delay: float = 0.05) -> None:
        time.sleep(delay)
        self.start(evaluation_id, 2)
        time.sleep(delay)
        self.succeed(evaluation_id)


@pytest.fixture
def evals(server) -> EvalDriver:
    return EvalDriver(server)


@pytest.fixture
def auto_eval(eval_queue, evals):
    """Every evaluation created while active runs to success in the background."""
    threads: list[threading.Thread] = []

    def handle(evaluation_id: str) -> None:
        thread = threading.Thread(target=evals.run, args=(evaluation_id,), daemon=True)
        thread.start()
        threads.append(thread)

    eval_queue.handler = handle
    yield evals
    for thread in threads:
        thread.join(timeout=10)


@pytest.fixture
def math_file(client) -> str:
    return client.files.upload(file=EVAL_MATH, purpose="eval", filename="math.jsonl").id


@pytest.fixture
def instruction_file(client) -> str:
    return client.files.upload(file=EVAL_INSTRUCTION, purpose="eval", filename="inst.jsonl").id


def finished_job(client, driver, train_file, *, final: bool = True, checkpoint: int = 2) -> str:
    """A job with a checkpoint, succeeded with an exported final model (or left running)."""
    job = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    driver.start(job.id, total_steps=checkpoint)
    driver.checkpoint(job.id, checkpoint, {"adapter_model.safetensors": b"w"})
    if final:
        with driver.server.sessions() as s:
            from models.tables import Job as JobRow

            team_id = s.get(JobRow, job.id).team_id
        prefix = job_prefix(team_id, job.id) + "final/"
        driver.finish(job.id, final_model={"prefix": prefix, "files": []})
    return job.id


def math(client, file_id, **kwargs) -> Evaluation:
    if "job_id" not in kwargs:
        kwargs.setdefault("base_model", "tiny-llama")
    return client.evaluations.create(file_id=file_id, kind="math", **kwargs)
