"""Reading evaluations back: lists (lazy pages, filters), other teams' evaluations looking
missing, reports (JSON, HTML, downloads), wait (until finished, or a timeout), the async client."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

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
from models.tables import Evaluation as EvaluationRow

from .conftest import EVAL_MATH, JUDGE, REPORT_DOC, REPORT_HTML, finished_job, math

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
