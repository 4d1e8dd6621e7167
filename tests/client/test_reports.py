"""client.jobs.report, client.reports.compare, `humanline jobs report` and `humanline reports
compare` against the real API. Jobs are driven through models.jobs as a worker would, and
their evaluations are written straight into the DB (there is no worker in these tests)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

from humanline_client import (
    AsyncClient,
    Client,
    Comparison,
    ComparisonGroup,
    ComparisonRow,
    ComparisonTest,
    JobReport,
    NotFoundError,
    UnprocessableEntityError,
)
from humanline_client.types import GroupPoint
from models.tables import Job
from tests.fixtures.rows import DQ, add_evaluation

from .test_examples import run_example


def trained_job(
    client, driver, train_file, variant: str = "offline+humanline", *, lean: bool = False, **kw
) -> str:
    """A job that logged 3 steps, scored its data, saved a checkpoint and succeeded. A `lean`
    one logged only its loss: its HTML page has one plot (each takes the API a while to
    draw)."""
    job = client.jobs.create(
        base_model="tiny-llama",
        training_file=train_file,
        objective=kw.pop("objective", "dpo"),
        variant=variant,
        seed=11,
        batch_size=kw.pop("batch_size", 8),  # the 8-pair file (a larger default: a warning)
        **kw,
    )
    driver.start(job.id, total_steps=3)
    if not lean:
        driver.event(job.id, "data_quality", "data quality", **DQ)
    for step in range(1, 4):
        values = {"loss": round(0.7 - 0.1 * step, 4)}
        if not lean:
            values.update(clamp_frac=0.1, kl=0.01 * step)
        driver.step(job.id, step, **values)
    driver.checkpoint(job.id, 3, {"adapter_model.safetensors": b"w"})
    driver.finish(job.id, final_step=3, code_version="git:v1.2.3")
    return job.id


# --- jobs.report -------------------------------------------------------------------------------


def test_job_report_json(client, server, driver, train_file):
    job_id = trained_job(client, driver, train_file)
    eid = add_evaluation(server.sessions, job_id, 0.41)
    report = client.jobs.report(job_id)
    assert isinstance(report, JobReport) and report.object == "report" and report._request_id
    assert report.job["id"] == job_id and report.job["status"] == "succeeded"
    assert report.job["variant"] == "offline+humanline"
    assert report.training["steps_logged"] == 3 and report.training["last_step"] == 3
    assert report.training["series"]["loss"]["steps"] == [1, 2, 3]
    assert report.training["final"]["loss"] == 0.4
    manifest = report.manifest
    assert manifest["training_file"]["sha256"] == client.files.retrieve(train_file).sha256
    assert manifest["seed"] == 11 and manifest["spec"]["humanline"] is True
    assert manifest["code_version"] == "git:v1.2.3"
    assert report.data_quality["histogram"] == DQ["histogram"]
    assert [e["id"] for e in report.evaluations] == [eid]
    assert report.evaluations[0]["metrics"]["lc_win_rate"]["value"] == 0.41
    assert report.warnings == []


def test_job_report_html_and_download(client, server, driver, train_file, tmp_path):
    job_id = trained_job(client, driver, train_file)
    add_evaluation(server.sessions, job_id, 0.41)
    page = client.jobs.report(job_id, format="html")
    assert isinstance(page, str) and page.lstrip().lower().startswith("<!doctype html")
    assert page.count("<svg") >= 3 and job_id in page and "git:v1.2.3" in page
    assert not re.search(r"https?://", page)  # self-contained

    lean = trained_job(client, driver, train_file, lean=True)
    dest = client.jobs.report(lean, format="html", to=tmp_path / "job.html")
    assert dest == tmp_path / "job.html"
    saved = dest.read_text()
    assert saved.count("<svg") == 1 and lean in saved
    as_json = client.jobs.report(lean, to=tmp_path / "job.json")
    assert json.loads(as_json.read_text())["job"]["id"] == lean

    # an answer cut off midway is fetched again; no partial file is left behind
    token = server.faults.plan(("drop", 0))
    faulty = client.with_options(default_headers={"X-Test-Fault": token})
    again = faulty.jobs.report(lean, format="html", to=tmp_path / "again.html")
    assert lean in again.read_text() and len(server.faults.seen[token]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.html", "job.html", "job.json"]

    with pytest.raises(UnprocessableEntityError) as info:
        client.jobs.report(job_id, format="pdf")
    assert info.value.field == "format"


def test_report_of_a_job_still_queued(client, train_file):
    job = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="kto")
    report = client.jobs.report(job.id)
    assert report.job["status"] == "queued" and report.training["steps_logged"] == 0
    assert report.evaluations == [] and report.data_quality is None
    assert "No metrics logged yet" in client.jobs.report(job.id, format="html")


def test_reports_are_team_isolated(server, client, driver, train_file):
    mine = trained_job(client, driver, train_file, lean=True)
    _, key = server.new_team()
    with Client(base_url=server.url, api_key=key, timeout=10) as other:
        for fmt in ("json", "html"):
            with pytest.raises(NotFoundError) as info:
                other.jobs.report(mine, format=fmt)
            assert info.value.field == "job_id"
        theirs_file = other.files.upload(file=client.files.content(train_file)).id
        theirs = other.jobs.create(
            base_model="tiny-llama", training_file=theirs_file, objective="dpo"
        ).id
        with pytest.raises(NotFoundError) as info:
            other.reports.compare(jobs=[theirs, mine])
        assert info.value.field == "jobs" and mine in info.value.message
    with pytest.raises(NotFoundError):
        client.jobs.report("job-does-not-exist")
    with pytest.raises(ValueError):
        client.jobs.report("")


# --- reports.compare ---------------------------------------------------------------------------


@pytest.fixture
def compared(client, server, driver, train_file) -> dict[str, Any]:
    """An offline and an offline+humanline job, each with an instruction evaluation (and a
    failed one and a math one that the lc_win_rate comparison ignores), and a job with none."""
    off = trained_job(client, driver, train_file, variant="offline", lean=True)
    hl = trained_job(client, driver, train_file, variant="offline+humanline", lean=True)
    bare = trained_job(client, driver, train_file, variant="offline", objective="kto", lean=True)
    file_id = client.files.upload(
        file=b'{"instruction": "Say hi.", "output": "hi"}\n', purpose="eval"
    ).id
    evals = {
        "off": add_evaluation(server.sessions, off, 0.30, file_id=file_id),
        "hl": add_evaluation(server.sessions, hl, 0.45, file_id=file_id),
        "failed": add_evaluation(server.sessions, hl, 0.90, status="failed"),
        "math": add_evaluation(server.sessions, hl, 0.25, kind="math"),
        "other_file": add_evaluation(server.sessions, off, 0.10, step=3),
    }
    return {"off": off, "hl": hl, "bare": bare, "file_id": file_id, "evals": evals}


def test_compare_json(client, compared):
    off, hl = compared["off"], compared["hl"]
    doc = client.reports.compare(jobs=[off, hl], file_id=compared["file_id"])
    assert isinstance(doc, Comparison) and doc._request_id
    assert doc.metric == "lc_win_rate" and doc.file_id == compared["file_id"]
    assert all(isinstance(r, ComparisonRow) for r in doc.rows)
    assert [(r.job_id, r.variant, r.objective, r.value) for r in doc.rows] == [
        (off, "offline", "dpo", 0.30),
        (hl, "offline+humanline", "dpo", 0.45),
    ]
    assert doc.row(hl).evaluation_id == compared["evals"]["hl"] and doc.row(hl).se == 0.02
    assert doc.row(hl).n == 100 and doc.row(hl).step is None and doc.row("job-x") is None
    [test] = doc.tests
    assert isinstance(test, ComparisonTest)
    assert (test.objective, test.a, test.b) == ("dpo", "offline+humanline", "offline")
    assert (test.job_a, test.job_b) == (hl, off)
    assert test.difference == pytest.approx(0.15) and test.p_value < 1e-4 and test.p_holm
    assert doc.warnings == []

    # Job objects work as well as ids; the rows follow the order given
    jobs = [client.jobs.retrieve(hl), client.jobs.retrieve(off), compared["bare"]]
    doc = client.reports.compare(jobs=jobs, metric="pass_at_1")
    assert doc.metric == "pass_at_1"
    assert [(r.job_id, r.value) for r in doc.rows] == [(hl, 0.25), (off, None), (jobs[2], None)]
    assert len(doc.warnings) == 2 and doc.tests == []
    # without file_id: off's newer evaluation, of a checkpoint, does not beat its final model's
    doc = client.reports.compare(jobs=f"{off},{hl}")
    assert doc.row(off).value == 0.30 and doc.row(off).evaluation_id == compared["evals"]["off"]


def test_compare_groups_jobs_by_a_metadata_key(client, server, compared, cli):
    off, hl = compared["off"], compared["hl"]
    with server.sessions() as s:
        for job_id in (off, hl):
            s.get(Job, job_id).meta = {"arm": "x"}
        s.commit()
    doc = client.reports.compare(jobs=[off, hl], file_id=compared["file_id"], group_by="arm")
    [group] = doc.groups.groups
    assert isinstance(group, ComparisonGroup) and doc.groups.key == "arm"
    assert group.jobs == [off, hl] and group.final["mean"] == pytest.approx(0.375)
    assert all(isinstance(p, GroupPoint) for p in group.curve)
    human = cli("reports", "compare", off, hl, "--group-by", "arm").stdout
    assert "ARM" in human and "0.375 ± 0.075" in human  # (0.30, 0.45): SE 0.106/√2


def test_compare_html_and_download(client, compared, tmp_path):
    ids = [compared["off"], compared["hl"]]
    page = client.reports.compare(jobs=ids, format="html")
    assert isinstance(page, str) and page.count("<svg") == 3  # Figure 1, cost, curves
    assert all(i in page for i in ids) and not re.search(r"https?://", page)
    dest = client.reports.compare(
        jobs=ids, format="html", metric="win_rate", to=tmp_path / "c.html"
    )
    assert dest.read_text().count("<svg") <= 1 and "win rate" in dest.read_text()
    saved = client.reports.compare(jobs=ids, to=tmp_path / "c.json")
    assert [r["job_id"] for r in json.loads(saved.read_text())["rows"]] == ids


def test_compare_errors(client, compared):
    one = compared["off"]
    cases = [
        ({"jobs": [one], "metric": "bogus"}, "metric"),
        ({"jobs": [f"job-{i}" for i in range(51)]}, "jobs"),
        ({"jobs": [one], "format": "pdf"}, "format"),
        ({"jobs": [one], "group_by": "arm"}, "group_by"),  # no job has that metadata key
    ]
    for kwargs, field in cases:
        with pytest.raises(UnprocessableEntityError) as info:
            client.reports.compare(**kwargs)
        assert info.value.field == field and info.value.message
    with pytest.raises(NotFoundError) as info:
        client.reports.compare(jobs=[one, "job-nope"])
    assert info.value.field == "jobs" and "job-nope" in info.value.message
    for empty in ([], " , ", ""):
        with pytest.raises(ValueError):
            client.reports.compare(jobs=empty)
    with pytest.raises(TypeError):
        client.reports.compare(jobs=[1, 2])


def test_reports_async(server, team, compared, tmp_path):
    async def go():
        async with AsyncClient(base_url=server.url, api_key=team[1], timeout=10) as client:
            report = await client.jobs.report(compared["hl"])
            assert isinstance(report, JobReport) and report.training["steps_logged"] == 3
            assert compared["hl"] in await client.jobs.report(compared["hl"], format="html")
            dest = await client.jobs.report(compared["hl"], format="html", to=tmp_path / "j.html")
            assert "<svg" in dest.read_text()
            doc = await client.reports.compare(jobs=[compared["off"], compared["hl"]])
            assert isinstance(doc, Comparison) and [r.value for r in doc.rows] == [0.30, 0.45]
            page = await client.reports.compare(jobs=[compared["hl"]], format="html")
            assert page.count("<svg") == 3  # Figure 1, cost, curves
            saved = await client.reports.compare(
                jobs=[compared["hl"]], format="html", to=tmp_path / "c.html"
            )
            assert saved.read_text().count("<svg") == 3
            with pytest.raises(NotFoundError):
                await client.jobs.report("job-nope")
            with pytest.raises(UnprocessableEntityError) as info:
                await client.reports.compare(jobs=[compared["hl"]], metric="bogus")
            assert info.value.field == "metric"

    asyncio.run(go())


# --- the CLI -----------------------------------------------------------------------------------


@pytest.fixture
def browser(monkeypatch) -> list[Path]:
    """webbrowser.open, recorded: the paths of the pages it was asked to show."""
    opened: list[Path] = []

    def fake_open(url: str, *args: Any, **kwargs: Any) -> bool:
        assert url.startswith("file://")
        opened.append(Path(unquote(urlparse(url).path)))
        return True

    monkeypatch.setattr("webbrowser.open", fake_open)
    return opened


def test_cli_jobs_report(cli, client, server, driver, train_file, compared, tmp_path, browser):
    hl = trained_job(client, driver, train_file)
    eid = add_evaluation(server.sessions, hl, 0.45)
    human = cli("jobs", "report", hl).stdout
    assert hl in human and "succeeded" in human and "steps logged: 3 (last 3)" in human
    assert "LAST VALUE" in human and "clamp_frac" in human and "git:v1.2.3" in human
    assert eid in human and "lc_win_rate 0.45 ± 0.02 (n=100)" in human
    assert "data quality: mean token log-prob -0.5 over 8 examples" in human
    as_json = json.loads(cli("jobs", "report", hl, "--json").stdout)
    assert as_json["object"] == "report" and as_json["job"]["id"] == hl

    lean = compared["hl"]  # HTML pages of one plot: quick to draw
    page = tmp_path / "report.html"
    saved = cli("jobs", "report", lean, "--html", str(page))
    assert saved.stdout == "" and f"wrote {page}" in saved.stderr
    assert "<svg" in page.read_text() and browser == []
    both = cli("jobs", "report", lean, "--html", str(tmp_path / "r2.html"), "--open", "--json")
    assert json.loads(both.stdout)["job"]["id"] == lean
    assert browser == [(tmp_path / "r2.html").resolve()]
    cli("jobs", "report", lean, "--open")  # no --html: a temporary file
    tmp_page = browser[-1]
    try:
        assert tmp_page.suffix == ".html" and lean in tmp_page.read_text()
    finally:
        tmp_page.unlink()

    missing = cli("jobs", "report", "job-nope", "--json", ok=False)
    error = json.loads(missing.stderr)["error"]
    assert missing.exit_code == 1 and error["status_code"] == 404 and error["field"] == "job_id"


def test_cli_reports_compare(cli, compared, tmp_path, browser):
    off, hl = compared["off"], compared["hl"]
    human = cli("reports", "compare", off, hl).stdout
    assert "LC_WIN_RATE" in human and "0.3 ± 0.02 (n=100)" in human and "0.45 ±" in human
    assert "dpo: offline+humanline - offline = 0.15" in human
    doc = json.loads(cli("reports", "compare", f"{off},{hl}", "--json").stdout)
    assert doc["object"] == "comparison" and [r["job_id"] for r in doc["rows"]] == [off, hl]
    math = json.loads(cli("reports", "compare", off, hl, "--metric", "pass_at_1", "--json").stdout)
    assert [r["value"] for r in math["rows"]] == [None, 0.25]
    filtered = json.loads(
        cli("reports", "compare", off, "--file-id", compared["file_id"], "--json").stdout
    )
    assert filtered["rows"][0]["evaluation_id"] == compared["evals"]["off"]
    warned = cli("reports", "compare", compared["bare"])
    assert "warning" in warned.stderr and "No job has a succeeded evaluation" in warned.stderr

    page = tmp_path / "compare.html"
    cli("reports", "compare", off, hl, "--html", str(page), "--open")
    assert page.read_text().count("<svg") == 3 and browser == [page.resolve()]
    bad = cli("reports", "compare", off, "--metric", "bogus", "--json", ok=False)
    assert bad.exit_code == 1 and json.loads(bad.stderr)["error"]["field"] == "metric"
    gone = cli("reports", "compare", off, "job-nope", ok=False)
    assert gone.exit_code == 1 and "404" in gone.stderr and "job-nope" in gone.stderr


# --- the example --------------------------------------------------------------------------------


def test_compare_variants_example_saves_the_reports(server, team, auto_worker, tmp_path):
    out = run_example(server, team[1], "compare_variants.py", "--model", "tiny-llama",
                      "--reports", str(tmp_path / "reports")).stdout  # fmt: skip
    table = out[out.index("metric") :].splitlines()
    assert table[1].split() == ["status", "succeeded", "succeeded"]
    pages = sorted(p.name for p in (tmp_path / "reports").iterdir())
    assert pages == ["offline+humanline.html", "offline.html"]
    for name in pages:
        assert (tmp_path / "reports" / name).read_text().count("<svg") >= 1
    assert "humanline reports compare" in out and "offline.html" in out
