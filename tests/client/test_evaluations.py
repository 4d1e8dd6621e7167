"""client.evaluations and `humanline evals` against the real API. No worker runs: the API's
evaluation queue is replaced by a recording one, and evaluations are moved through their
states (and their stored reports written) directly in the DB and the object store, as
worker/evaluate.py would."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest
from humanline_client import (
    AsyncClient,
    AsyncCursorPage,
    Client,
    ConflictError,
    Evaluation,
    EvaluationReport,
    EvaluationWaitTimeout,
    NotFoundError,
    UnprocessableEntityError,
)
from humanline_client.cli import app
from sqlalchemy import update
from typer.testing import CliRunner

from models.base import utcnow
from models.tables import Evaluation as EvaluationRow
from storage.keys import job_prefix, report_key

from .conftest import jsonl

JUDGE_URL = "http://judge.internal:8000/v1"
JUDGE = {"type": "openai", "base_url": JUDGE_URL, "model": "gpt-4.1"}
EVAL_MATH = jsonl([{"problem": f"{i}+{i}?", "answer": str(2 * i)} for i in range(4)])
EVAL_INSTRUCTION = jsonl([{"instruction": f"Say {i}.", "output": f"{i}."} for i in range(3)])
REPORT_DOC = {
    "kind": "math",
    "metrics": {"pass_at_1": {"value": 0.5, "se": 0.1, "n": 4}, "pass_at_n": 0.75},
    "items": [{"problem": "0+0?", "correct": [True]}, {"problem": "1+1?", "correct": [False]}],
    "timing": {"generate_s": 1.5},
}
REPORT_HTML = b"<!DOCTYPE html><html><body><h1>evaluation report</h1></body></html>"


# --- the evaluation "worker" ---------------------------------------------------------------------


@dataclass
class EvalQueue:
    """Stands in for the API's evaluation queue: records ids, and hands them to `handler`."""

    ids: list[str] = field(default_factory=list)
    handler: Callable[[str], None] | None = None

    def enqueue(self, evaluation_id: str) -> None:
        self.ids.append(evaluation_id)
        if self.handler is not None:
            self.handler(evaluation_id)


@pytest.fixture(autouse=True)
def eval_env(monkeypatch):
    """The operator's judge settings (read by the API from the environment)."""
    monkeypatch.setenv("EVAL_JUDGE_BASE_URLS", f"{JUDGE_URL}, http://other:1/v1")
    monkeypatch.setenv("EVAL_REWARD_MODELS", "armorm=/models/armorm")
    monkeypatch.delenv("MAX_EVALS_PER_TEAM", raising=False)


@pytest.fixture(autouse=True)
def eval_queue(server):
    """Every test here: evaluations go to a recording queue, never to a worker."""
    state = server.faults.app.state
    before = getattr(state, "eval_queue", None)
    state.eval_queue = EvalQueue()
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
        summary = {"kind": doc.get("kind"), "metrics": doc.get("metrics"), "report": keys}
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


# --- create ------------------------------------------------------------------------------------


def test_create_and_retrieve(client, eval_queue, math_file, instruction_file):
    ev = math(client, math_file, generation={"temperature": 0.2}, max_items=3)
    assert isinstance(ev, Evaluation) and ev.status == "queued" and not ev.is_terminal
    assert (ev.kind, ev.base_model, ev.job_id, ev.step, ev.file_id) == (
        "math",
        "tiny-llama",
        None,
        None,
        math_file,
    )
    assert ev.config["generation"] == {  # unset fields: the server's math defaults
        "n": 4,
        "temperature": 0.2,
        "top_p": 0.95,
        "max_new_tokens": 1024,
        "seed": 0,
    }
    assert ev.config["max_items"] == 3 and ev.metrics == {} and ev.result is None
    assert ev._request_id and eval_queue.ids == [ev.id]
    again = client.evaluations.retrieve(ev.id)
    assert again.to_dict() == ev.to_dict() and again.created_at is not None

    judged = client.evaluations.create(
        base_model="tiny-llama", file_id=instruction_file, kind="instruction", judge=JUDGE
    )
    assert judged.config["judge"] == JUDGE and judged.config["generation"]["n"] == 1
    rm = client.evaluations.create(
        base_model="tiny-llama",
        file_id=instruction_file,
        kind="instruction",
        judge={"type": "reward_model", "model": "armorm"},
    )
    assert rm.config["judge"] == {"type": "reward_model", "model": "armorm"}
    custom = math(
        client,
        math_file,
        prompt_template="Solve: {problem}",
        system_prompt="Be brief.",
        generation={"n": 8},
        extra_body={"max_items": 2},
    )
    assert custom.config["prompt_template"] == "Solve: {problem}"
    assert custom.config["generation"]["n"] == 8 and custom.config["max_items"] == 2
    assert eval_queue.ids == [ev.id, judged.id, rm.id, custom.id]


def test_evaluating_a_job_or_one_of_its_checkpoints(
    client, eval_queue, driver, train_file, math_file
):
    done = finished_job(client, driver, train_file)
    ev = math(client, math_file, job_id=done)
    assert ev.job_id == done and ev.base_model is None and ev.step is None
    at_step = math(client, math_file, job_id=done, step=2)
    assert at_step.step == 2 and at_step.config["step"] == 2

    running = finished_job(client, driver, train_file, final=False)
    with pytest.raises(ConflictError) as info:  # no exported final model yet
        math(client, math_file, job_id=running)
    assert info.value.field == "job_id"
    assert math(client, math_file, job_id=running, step=2).status == "queued"
    with pytest.raises(NotFoundError) as info:
        math(client, math_file, job_id=running, step=7)
    assert info.value.field == "step"


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"judge": {"type": "openai", "base_url": "http://evil.example/v1", "model": "m"}},
         "judge.base_url"),
        ({"judge": {"type": "reward_model", "model": "/etc/passwd"}}, "judge.model"),
        ({"judge": None}, "judge"),
        ({"generation": {"n": 2}}, "generation.n"),
        ({"generation": {"temperature": 5}}, "generation.temperature"),
        ({"prompt_template": "Q: {problem}"}, "prompt_template"),
        ({"step": 3}, "step"),
        ({"job_id": "job-x"}, "job_id"),  # a job and a base model
        ({"base_model": None}, "job_id"),  # neither
        ({"base_model": "gpt-5"}, "base_model"),
        ({"kind": "poetry"}, "kind"),
        ({"extra_body": {"surprise": 1}}, "surprise"),
    ],
)  # fmt: skip
def test_invalid_requests_raise_422_with_the_field(
    client, eval_queue, instruction_file, overrides, field
):
    kwargs: dict[str, Any] = {
        "base_model": "tiny-llama",
        "file_id": instruction_file,
        "kind": "instruction",
        "judge": JUDGE,
        **overrides,
    }
    with pytest.raises(UnprocessableEntityError) as info:
        client.evaluations.create(**kwargs)
    assert info.value.status_code == 422 and info.value.field == field, info.value
    assert info.value.message and eval_queue.ids == []


def test_the_eval_file_is_checked(client, eval_queue, train_file, math_file, instruction_file):
    for file_id, text in ((train_file, "purpose"), (instruction_file, "eval_math")):
        with pytest.raises(UnprocessableEntityError, match=text) as info:
            math(client, file_id)
        assert info.value.field == "file_id"
    with pytest.raises(NotFoundError) as info:
        math(client, "file-does-not-exist")
    assert info.value.field == "file_id"


def test_create_is_idempotent_across_retries(client, server, team, eval_queue, math_file):
    """The evaluation is created but the answer is lost: the retry carries the same
    Idempotency-Key and gets the original back, so there is one evaluation, not two."""
    token = server.faults.plan(("after", 503))
    faulty = client.with_options(default_headers={"X-Test-Fault": token})
    ev = math(faulty, math_file)
    seen = server.faults.seen[token]
    assert len(seen) == 2 and len({h["idempotency-key"] for h in seen}) == 1
    assert [e.id for e in client.evaluations.list()] == [ev.id] and eval_queue.ids == [ev.id]
    same = math(client, math_file, idempotency_key="eval-key-1")
    assert math(client, math_file, idempotency_key="eval-key-1").id == same.id
    with pytest.raises(ConflictError):  # the same key with another body
        math(client, math_file, idempotency_key="eval-key-1", max_items=1)


# --- list and read -----------------------------------------------------------------------------


def test_list_pages_lazily_and_filters(
    client, eval_queue, evals, driver, train_file, math_file, instruction_file
):
    job_id = finished_job(client, driver, train_file)
    created = [math(client, math_file) for _ in range(3)]
    created.append(math(client, math_file, job_id=job_id))
    created.append(
        client.evaluations.create(
            base_model="tiny-llama", file_id=instruction_file, kind="instruction", judge=JUDGE
        )
    )
    newest_first = [e.id for e in reversed(created)]
    listing = client.evaluations.list(limit=2)
    assert [len(p.data) for p in listing.pages()] == [2, 2, 1]
    assert [e.id for e in listing] == newest_first
    first = listing.first_page()
    assert first.has_more and first.last_id == newest_first[1]
    assert [e.id for e in first.next_page()] == newest_first[2:4]
    assert all(isinstance(e, Evaluation) for e in listing.to_list())

    assert [e.id for e in client.evaluations.list(kind="instruction")] == [created[4].id]
    assert [e.id for e in client.evaluations.list(job_id=job_id)] == [created[3].id]
    evals.succeed(created[0].id)
    done = client.evaluations.list(status="succeeded").to_list()
    assert [e.id for e in done] == [created[0].id]
    assert done[0].metrics["pass_at_1"] == {"value": 0.5, "se": 0.1, "n": 4}
    assert "report" not in done[0].result  # the object keys stay on the server
    assert len(client.evaluations.list(status="queued", limit=1).to_list()) == 4
    with pytest.raises(UnprocessableEntityError) as info:
        client.evaluations.list(status="bogus").first_page()
    assert info.value.field == "status"


def test_other_teams_evaluations_look_missing(
    server, client, eval_queue, evals, driver, train_file, math_file
):
    ev = math(client, math_file)
    evals.succeed(ev.id)
    job_id = finished_job(client, driver, train_file)
    _, key = server.new_team()
    with Client(base_url=server.url, api_key=key, timeout=10) as other:
        for call in (
            lambda: other.evaluations.retrieve(ev.id),
            lambda: other.evaluations.report(ev.id),
            lambda: other.evaluations.report(ev.id, format="html"),
        ):
            with pytest.raises(NotFoundError) as info:
                call()
            assert info.value.field == "evaluation_id"
        assert other.evaluations.list().to_list() == []
        with pytest.raises(NotFoundError) as info:  # nor their files, nor their jobs
            math(other, math_file)
        assert info.value.field == "file_id"
        theirs = other.files.upload(file=EVAL_MATH, purpose="eval").id
        with pytest.raises(NotFoundError) as info:
            math(other, theirs, job_id=job_id)
        assert info.value.field == "job_id"
    with pytest.raises(NotFoundError):
        client.evaluations.retrieve("eval-does-not-exist")
    with pytest.raises(NotFoundError):  # a slash cannot reach another route
        client.evaluations.retrieve("../jobs")
    with pytest.raises(ValueError):
        client.evaluations.retrieve("")


def test_report_json_html_and_downloads(client, server, eval_queue, evals, math_file, tmp_path):
    ev = math(client, math_file)
    with pytest.raises(ConflictError) as info:  # no report before it succeeded
        client.evaluations.report(ev.id)
    assert info.value.field == "evaluation_id"
    evals.succeed(ev.id)

    report = client.evaluations.report(ev.id)
    assert isinstance(report, EvaluationReport) and report._request_id
    assert report.kind == "math" and report.metrics == REPORT_DOC["metrics"]
    assert report.items == REPORT_DOC["items"]
    assert report.timing == {"generate_s": 1.5}  # fields the SDK does not name are kept
    assert report.to_dict() == REPORT_DOC

    page = client.evaluations.report(ev.id, format="html")
    assert isinstance(page, str) and page == REPORT_HTML.decode()
    dest = client.evaluations.report(ev.id, format="html", to=tmp_path / "report.html")
    assert dest == tmp_path / "report.html" and dest.read_bytes() == REPORT_HTML
    saved = client.evaluations.report(ev.id, to=str(tmp_path / "report.json"))
    assert json.loads(saved.read_bytes()) == REPORT_DOC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.json"]

    # a download cut off midway is fetched again, and no partial file is left behind
    token = server.faults.plan(("drop", 0))
    faulty = client.with_options(default_headers={"X-Test-Fault": token})
    again = faulty.evaluations.report(ev.id, format="html", to=tmp_path / "again.html")
    assert again.read_bytes() == REPORT_HTML and len(server.faults.seen[token]) == 2
    assert not list(tmp_path.glob("*.part"))

    with pytest.raises(UnprocessableEntityError) as info:
        client.evaluations.report(ev.id, format="pdf")
    assert info.value.field == "format"
    with server.sessions() as s:
        keys = s.get(EvaluationRow, ev.id).result["report"]
    server.store.delete(keys["json"])
    with pytest.raises(NotFoundError):
        client.evaluations.report(ev.id)


# --- wait ----------------------------------------------------------------------------------------


def test_wait_polls_until_it_finishes(client, eval_queue, evals, math_file):
    ev = math(client, math_file)
    seen: list[tuple[str, Any]] = []
    worker = threading.Thread(target=evals.run, args=(ev.id, 0.15), daemon=True)
    worker.start()
    done = client.evaluations.wait(
        ev.id,
        poll_interval=0.02,
        on_update=lambda e: seen.append((e.status, (e.result or {}).get("progress"))),
    )
    worker.join()
    assert done.status == "succeeded" and done.is_terminal and done.finished_at is not None
    assert done.metrics["pass_at_1"]["value"] == 0.5
    assert seen[0] == ("queued", None) and seen[-1][0] == "succeeded"
    assert ("running", {"phase": "generating", "done": 2, "total": 4}) in seen
    assert len(seen) == len(set(map(str, seen)))  # only changes are reported

    failing = math(client, math_file)
    evals.fail(failing.id)
    failed = client.evaluations.wait(failing.id)  # failures are returned, not raised
    assert failed.status == "failed" and failed.error["type"] == "judge_error"


def test_wait_times_out_and_the_evaluation_goes_on(client, eval_queue, math_file):
    ev = math(client, math_file)
    started = time.monotonic()
    with pytest.raises(EvaluationWaitTimeout) as info:
        client.evaluations.wait(ev.id, timeout=0.3, poll_interval=0.05)
    assert 0.3 <= time.monotonic() - started < 3
    assert isinstance(info.value, TimeoutError) and info.value.evaluation.status == "queued"
    assert client.evaluations.retrieve(ev.id).status == "queued"
    with pytest.raises(ValueError):
        client.evaluations.wait(ev.id, poll_interval=0)


# --- async -------------------------------------------------------------------------------------


def test_evaluations_async(server, team, eval_queue, evals, math_file, tmp_path):
    async def go():
        async with AsyncClient(base_url=server.url, api_key=team[1], timeout=10) as client:
            created = [
                await client.evaluations.create(
                    base_model="tiny-llama", file_id=math_file, kind="math"
                )
                for _ in range(3)
            ]
            listing = client.evaluations.list(limit=2)
            first = await listing.first_page()
            assert isinstance(first, AsyncCursorPage) and first.has_more
            assert [e.id async for e in listing] == [e.id for e in reversed(created)]
            assert (await client.evaluations.retrieve(created[0].id)).id == created[0].id
            with pytest.raises(ConflictError):
                await client.evaluations.report(created[0].id)
            with pytest.raises(UnprocessableEntityError) as info:
                await client.evaluations.create(
                    base_model="tiny-llama", file_id=math_file, kind="math", judge=JUDGE
                )
            assert info.value.field == "judge"

            seen: list[str] = []

            async def on_update(ev: Evaluation) -> None:
                seen.append(ev.status)

            worker = threading.Thread(target=evals.run, args=(created[0].id, 0.1), daemon=True)
            worker.start()
            done = await client.evaluations.wait(
                created[0].id, poll_interval=0.02, on_update=on_update
            )
            worker.join()
            assert done.status == "succeeded" and seen[0] == "queued" and seen[-1] == "succeeded"
            with pytest.raises(EvaluationWaitTimeout):
                await client.evaluations.wait(created[1].id, timeout=0.1, poll_interval=0.02)

            report = await client.evaluations.report(created[0].id)
            assert isinstance(report, EvaluationReport) and len(report.items) == 2
            assert await client.evaluations.report(created[0].id, format="html") == (
                REPORT_HTML.decode()
            )
            dest = await client.evaluations.report(
                created[0].id, format="html", to=tmp_path / "a.html"
            )
            assert dest.read_bytes() == REPORT_HTML

    asyncio.run(go())


# --- the CLI -----------------------------------------------------------------------------------


@pytest.fixture
def cli(server, team):
    runner = CliRunner()
    env = {"HUMANLINE_BASE_URL": server.url, "HUMANLINE_API_KEY": team[1]}

    def invoke(*args: str, ok: bool = True):
        result = runner.invoke(app, list(args), env=env)
        if ok:
            assert result.exit_code == 0, (result.output, result.exception)
        return result

    return invoke


def test_cli_evals_create_list_show(cli, client, eval_queue, evals, tmp_path, instruction_file):
    path = tmp_path / "math.jsonl"
    path.write_bytes(EVAL_MATH)
    created = cli(
        "evals", "create", "--file", str(path), "--kind", "math", "--model", "tiny-llama",
        "--set", "generation.n=8", "--max-items", "3", "--json",
    )  # fmt: skip
    ev = json.loads(created.stdout)
    assert "uploaded" in created.stderr and ev["status"] == "queued"
    assert ev["config"]["generation"]["n"] == 8 and ev["config"]["max_items"] == 3
    math_file = ev["file_id"]
    assert client.files.retrieve(math_file).purpose == "eval"

    human = cli(
        "evals", "create", "--file", instruction_file, "--kind", "instruction",
        "--model", "tiny-llama", "--judge-url", JUDGE_URL, "--judge-model", "gpt-4.1",
    ).stdout  # fmt: skip
    assert human.startswith("created eval-") and "base tiny-llama" in human
    judged = human.split()[1]
    rm = json.loads(
        cli(
            "evals", "create", "--file", instruction_file, "--kind", "instruction",
            "--model", "tiny-llama", "--reward-model", "armorm", "--json",
        ).stdout
    )  # fmt: skip
    assert rm["config"]["judge"] == {"type": "reward_model", "model": "armorm"}
    spec = tmp_path / "eval.json"
    spec.write_text(json.dumps({"base_model": "tiny-llama", "kind": "math", "max_items": 1}))
    from_spec = json.loads(cli("evals", "create", "--spec", str(spec), "--file", math_file,
                               "--json").stdout)  # fmt: skip
    assert from_spec["config"]["max_items"] == 1

    bad = cli("evals", "create", "--file", math_file, "--kind", "math", "--model", "tiny-llama",
              "--set", "generation.temperature=9", "--json", ok=False)  # fmt: skip
    error = json.loads(bad.stderr)["error"]
    assert bad.exit_code == 1 and error["status_code"] == 422
    assert error["field"] == "generation.temperature"
    bad = cli("evals", "create", "--file", math_file, "--kind", "math", ok=False)
    assert bad.exit_code == 1 and "job_id" in bad.stderr
    missing = cli("evals", "create", "--kind", "math", ok=False)
    assert missing.exit_code != 0 and "--file" in missing.output

    evals.succeed(ev["id"])
    table = cli("evals", "list").stdout
    assert "STATUS" in table and ev["id"] in table and judged in table
    assert "pass_at_1 0.5 ± 0.1 (n=4)" in table
    listed = json.loads(cli("evals", "list", "--json").stdout)
    assert [e["id"] for e in listed] == [from_spec["id"], rm["id"], judged, ev["id"]]
    assert len(json.loads(cli("evals", "list", "--limit", "2", "--json").stdout)) == 2
    assert [
        e["id"] for e in json.loads(cli("evals", "list", "--kind", "math", "--json").stdout)
    ] == [from_spec["id"], ev["id"]]
    assert [
        e["id"] for e in json.loads(cli("evals", "list", "--status", "succeeded", "--json").stdout)
    ] == [ev["id"]]

    shown = cli("evals", "show", judged).stdout
    assert judged in shown and f"openai {JUDGE_URL} gpt-4.1" in shown and "queued" in shown
    assert "pass_at_1" in cli("evals", "show", ev["id"]).stdout
    assert json.loads(cli("evals", "show", ev["id"], "--json").stdout)["status"] == "succeeded"
    gone = cli("evals", "show", "eval-nope", "--json", ok=False)
    assert gone.exit_code == 1 and json.loads(gone.stderr)["error"]["status_code"] == 404


def test_cli_evals_report_and_wait(cli, client, eval_queue, evals, math_file, tmp_path,
                                   monkeypatch):  # fmt: skip
    ev = math(client, math_file)
    early = cli("evals", "report", ev.id, ok=False)
    assert early.exit_code == 1 and "409" in early.stderr
    evals.succeed(ev.id)

    human = cli("evals", "report", ev.id).stdout
    assert "pass_at_1" in human and "0.5 ± 0.1" in human and "2 items" in human
    assert json.loads(cli("evals", "report", ev.id, "--json").stdout) == REPORT_DOC
    page = tmp_path / "eval.html"
    saved = cli("evals", "report", ev.id, "--html", str(page))
    assert page.read_bytes() == REPORT_HTML and f"wrote {page}" in saved.stderr
    assert saved.stdout == ""
    cli("evals", "report", ev.id, "-o", str(tmp_path / "eval.json"))
    assert json.loads((tmp_path / "eval.json").read_text()) == REPORT_DOC

    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", lambda url, *a, **k: opened.append(url) or True)
    cli("evals", "report", ev.id, "--open")
    assert opened[0].startswith("file://") and opened[0].endswith(".html")
    tmp_page = Path(unquote(urlparse(opened[0]).path))
    try:
        assert tmp_page.read_bytes() == REPORT_HTML
    finally:
        tmp_page.unlink()

    waited = json.loads(cli("evals", "wait", ev.id, "--json").stdout)
    assert waited["id"] == ev.id and waited["status"] == "succeeded"
    failing = math(client, math_file)
    evals.fail(failing.id, "judge down")
    result = cli("evals", "wait", failing.id, ok=False)
    assert result.exit_code == 1 and f"{failing.id} failed" in result.stdout
    assert "judge down" in result.stderr
    queued = math(client, math_file)
    slow = cli("evals", "wait", queued.id, "--timeout", "0.2", "--poll-interval", "0.05",
               "--json", ok=False)  # fmt: skip
    assert slow.exit_code == 1 and json.loads(slow.stderr)["error"]["type"] == (
        "EvaluationWaitTimeout"
    )


def test_cli_evals_create_wait(cli, auto_eval, math_file):
    waited = json.loads(
        cli("evals", "create", "--file", math_file, "--kind", "math", "--model", "tiny-llama",
            "--wait", "--poll-interval", "0.05", "--json").stdout
    )  # fmt: skip
    assert waited["status"] == "succeeded" and waited["result"]["metrics"]["pass_at_1"]
    human = cli("evals", "create", "--file", math_file, "--kind", "math", "--model", "tiny-llama",
                "--wait", "--poll-interval", "0.05")  # fmt: skip
    assert "waiting" in human.stdout and "succeeded: pass_at_1 0.5" in human.stdout
    assert "queued" in human.stderr and "succeeded" in human.stderr
