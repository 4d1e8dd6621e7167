"""GET /v1/jobs/{id}/report and GET /v1/reports/compare: built from the DB on request,
team-isolated, HTML without external URLs, and the API process never imports torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from models import jobs as job_states
from models.tables import File, Job
from tests.api.conftest import job_body, upload
from tests.fixtures.rows import DQ, add_evaluation

REPO = Path(__file__).resolve().parents[2]


def _trained_job(client, team, db_sessions, variant="offline+humanline", objective="dpo") -> str:
    """A job that ran 5 steps, scored its data and succeeded, as the worker would record it."""
    train = upload(client, team).json()["id"]
    job = client.post(
        "/v1/jobs",
        headers=team.headers,
        json=job_body(train, variant=variant, objective=objective, seed=11),
    ).json()
    with db_sessions() as s:
        assert job_states.claim(s, job["id"], "w1", 60) is not None
        job_states.add_event(s, job["id"], "started", "training", {"total_steps": 5})
        for step in range(1, 6):
            job_states.record_metrics(
                s,
                job["id"],
                step,
                {
                    "loss": 0.7 - 0.05 * step,
                    "grad_norm": 1.0,
                    "lr": 1e-6,
                    "clamp_frac": 0.1,
                    "kl": 0.01 * step,
                },
            )
        job_states.add_event(s, job["id"], "data_quality", "data quality", DQ)
        job_states.add_event(s, job["id"], "finished", "finished 5 steps", {"step": 5})
        assert job_states.finish(
            s, job["id"], "w1", "succeeded", result={"step": 5, "code_version": "git:v1.2.3"}
        )
        s.commit()
    return job["id"]


def test_job_report_json(client, team_a, db_sessions):
    job_id = _trained_job(client, team_a, db_sessions)
    eid = add_evaluation(db_sessions, job_id, 0.41)
    r = client.get(f"/v1/jobs/{job_id}/report", headers=team_a.headers)
    assert r.status_code == 200, r.text
    rep = r.json()
    assert (
        rep["object"] == "report"
        and rep["job"]["id"] == job_id
        and rep["job"]["status"] == "succeeded"
    )
    assert rep["job"]["variant"] == "offline+humanline"
    assert rep["training"]["series"]["loss"]["steps"] == [1, 2, 3, 4, 5]
    assert rep["training"]["final"]["loss"] == 0.7 - 0.25
    man = rep["manifest"]
    with db_sessions() as s:
        job = s.get(Job, job_id)
        sha = s.get(File, job.training_file_id).sha256
    assert man["training_file"]["sha256"] == sha and man["seed"] == 11 and man["spec"]["seed"] == 11
    assert man["code_version"] == "git:v1.2.3"
    phases = {p["phase"] for p in man["wall_clock"]["phases"]}
    assert {"queued", "setup", "training", "finalize"} >= phases and "training" in phases
    assert rep["data_quality"]["histogram"] == DQ["histogram"]
    assert [e["id"] for e in rep["evaluations"]] == [eid]
    assert rep["evaluations"][0]["metrics"]["lc_win_rate"]["value"] == 0.41


def test_job_report_html(client, team_a, db_sessions):
    job_id = _trained_job(client, team_a, db_sessions)
    add_evaluation(db_sessions, job_id, 0.41)
    r = client.get(f"/v1/jobs/{job_id}/report", headers=team_a.headers, params={"format": "html"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    html = r.text
    assert html.count("<svg") >= 5 and job_id in html and "git:v1.2.3" in html
    assert not re.search(r"https?://", html)


def test_report_of_a_job_still_queued(client, team_a, train_file):
    job = client.post("/v1/jobs", headers=team_a.headers, json=job_body(train_file)).json()
    rep = client.get(f"/v1/jobs/{job['id']}/report", headers=team_a.headers).json()
    assert rep["training"]["steps_logged"] == 0 and rep["evaluations"] == []
    html = client.get(
        f"/v1/jobs/{job['id']}/report", headers=team_a.headers, params={"format": "html"}
    )
    assert html.status_code == 200 and "No metrics logged yet" in html.text


def test_job_report_is_team_isolated(client, team_a, team_b, db_sessions):
    job_id = _trained_job(client, team_a, db_sessions)
    r = client.get(f"/v1/jobs/{job_id}/report", headers=team_b.headers)
    assert r.status_code == 404 and r.json()["error"]["field"] == "job_id"
    assert client.get(f"/v1/jobs/{job_id}/report").status_code == 401


def test_compare_jobs(client, team_a, db_sessions):
    off = _trained_job(client, team_a, db_sessions, variant="offline")
    hl = _trained_job(client, team_a, db_sessions, variant="offline+humanline")
    add_evaluation(db_sessions, off, 0.30)
    add_evaluation(db_sessions, hl, 0.45)
    add_evaluation(db_sessions, hl, 0.90, status="failed")  # ignored
    add_evaluation(db_sessions, hl, 0.25, kind="math")
    r = client.get(
        "/v1/reports/compare",
        headers=team_a.headers,
        params={"jobs": f"{off},{hl}", "format": "json"},
    )
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["metric"] == "lc_win_rate"
    assert [(row["job_id"], row["variant"], row["value"]) for row in doc["rows"]] == [
        (off, "offline", 0.30),
        (hl, "offline+humanline", 0.45),
    ]
    [test] = doc["tests"]
    assert test["a"] == "offline+humanline" and test["b"] == "offline" and test["p_value"] < 1e-4
    math = client.get(
        "/v1/reports/compare",
        headers=team_a.headers,
        params={"jobs": f"{off},{hl}", "format": "json", "metric": "pass_at_1"},
    ).json()
    assert [row["value"] for row in math["rows"]] == [None, 0.25]
    html = client.get("/v1/reports/compare", headers=team_a.headers, params={"jobs": f"{off},{hl}"})
    assert html.status_code == 200 and "by objective and variant" in html.text
    # the route passes each job's metrics and timing: cost, quality vs cost, curves
    assert "against cost" in html.text and "Training curves" in html.text
    assert html.text.count("<svg") >= 3
    assert not re.search(r"https?://", html.text)


def test_compare_errors(client, team_a, team_b, db_sessions):
    mine = _trained_job(client, team_a, db_sessions)
    theirs = _trained_job(client, team_b, db_sessions)

    def get(**q):
        return client.get("/v1/reports/compare", headers=team_a.headers, params=q)

    r = get(jobs=f"{mine},{theirs}")
    assert r.status_code == 404 and r.json()["error"]["field"] == "jobs" and theirs in r.text
    assert get(jobs=mine, metric="bogus").json()["error"]["field"] == "metric"
    assert get(jobs=" , ").json()["error"]["field"] == "jobs"
    assert get(jobs=",".join(f"job-{i}" for i in range(51))).status_code == 422
    assert get().json()["error"]["field"] == "jobs"
    assert get(jobs=mine, format="pdf").json()["error"]["field"] == "format"


def test_the_api_renders_reports_without_importing_torch(tmp_path):
    """In a fresh interpreter: the app, a job with metrics, both report routes; torch never
    enters sys.modules (DESIGN.md §5: the API image has no torch)."""
    script = textwrap.dedent(
        f"""
        import sys
        from fastapi.testclient import TestClient
        from api.main import create_app
        from models.base import Base
        from models.db import make_engine, make_session_factory
        from models.settings import Settings
        from models.teams import create_team, create_api_key
        from models import jobs as job_states
        from models.tables import File

        url = "sqlite:///{tmp_path / "db.sqlite"}"
        engine = make_engine(url)
        Base.metadata.create_all(engine)
        sessions = make_session_factory(engine)
        with sessions() as s:
            team = create_team(s, "t")
            _, key = create_api_key(s, team.id)
            f = File(team_id=team.id, filename="x", purpose="train", bytes=1, sha256="0" * 64,
                     format="preference", records=1, status="processed", object_key="k")
            s.add(f); s.flush()
            job = job_states.create_job(s, team_id=team.id,
                                        spec={{"seed": 1, "training_file": f.id}},
                                        metadata={{}}, training_file_id=f.id)
            job_states.record_metrics(s, job.id, 1, {{"loss": 0.5}})
            s.commit()
            job_id = job.id
        settings = Settings(DATABASE_URL=url, STORAGE_URL="file://{tmp_path / "objects"}",
                            LOG_LEVEL="WARNING")
        client = TestClient(create_app(settings, session_factory=sessions))
        h = {{"Authorization": "Bearer " + key}}
        assert client.get(f"/v1/jobs/{{job_id}}/report?format=html", headers=h).status_code == 200
        assert client.get(f"/v1/reports/compare?jobs={{job_id}}", headers=h).status_code == 200
        print(json.dumps({{"torch": "torch" in sys.modules,
                          "matplotlib": "matplotlib" in sys.modules}}))
        """
    ).replace("import sys\n", "import sys, json\n", 1)
    out = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    flags = json.loads(out.stdout.strip().splitlines()[-1])
    assert flags == {"torch": False, "matplotlib": True}


def test_compare_groups_jobs_by_a_metadata_key(client, team_a, db_sessions):
    jobs = [_trained_job(client, team_a, db_sessions) for _ in range(3)]
    with db_sessions() as s:
        for job_id, arm in zip(jobs, ("online", "online", "stale"), strict=True):
            s.get(Job, job_id).meta = {"arm": arm}
        s.commit()
    for job_id, (mid, final) in zip(jobs, ((0.2, 0.4), (0.4, 0.6), (0.1, 0.2)), strict=True):
        add_evaluation(db_sessions, job_id, mid, kind="math", step=2)
        add_evaluation(db_sessions, job_id, final, kind="math")

    def get(**q):
        q = {"jobs": ",".join(jobs), "metric": "pass_at_1", **q}
        return client.get("/v1/reports/compare", headers=team_a.headers, params=q)

    doc = get(group_by="arm", format="json").json()
    online, stale = doc["groups"]["groups"]
    assert online["group"] == "online" and online["jobs"] == jobs[:2]
    # the final model counts at the job's last step (5 logged steps)
    assert [(c["step"], round(c["mean"], 6), round(c["se"], 6)) for c in online["curve"]] == [
        (2, 0.3, 0.1),
        (5, 0.5, 0.1),
    ]
    assert stale["final"] == {"mean": 0.2, "se": None, "n": 1}
    html = get(group_by="arm").text
    assert "Groups by arm" in html and html.count("<svg") >= 5
    r = get(group_by="seed")
    assert r.status_code == 422 and r.json()["error"]["field"] == "group_by"
    assert "seed" in r.json()["error"]["message"]
    assert get(group_by="a b").json()["error"]["field"] == "group_by"
