"""GET /v1/evaluations/{id}/export (issue 35): AlpacaEval's model_outputs.json and leaderboard
row, lighteval's results file, each with the evaluation's provenance; refused (409) before the
evaluation succeeded or for the wrong kind, 422 for an unknown format, 404 across teams."""

from __future__ import annotations

import csv
import io
import json

from sqlalchemy import update

from models.tables import Evaluation
from storage.keys import report_key
from tests.api import test_evaluations as te
from tests.reports.test_exports import _instruction_doc, _math_doc

# the evaluation tests' fixtures (the operator's judge settings, the queue, eval files)
eval_env, eval_queue = te.eval_env, te.eval_queue
instruction_file, math_file = te.instruction_file, te.math_file
_instruction, _math, _post = te._instruction, te._math, te._post


def _succeed(db_sessions, store, team, eid: str, doc: dict) -> None:
    keys = {
        "json": report_key(team.id, eid, f"{eid}.json"),
        "html": report_key(team.id, eid, f"{eid}.html"),
    }
    store.put_bytes(keys["json"], json.dumps(doc).encode())
    with db_sessions() as s:
        s.execute(
            update(Evaluation)
            .where(Evaluation.id == eid)
            .values(status="succeeded", result={"metrics": doc["metrics"], "report": keys})
        )
        s.commit()


def test_alpaca_eval_export(
    client, team_a, team_b, instruction_file, eval_queue, db_sessions, store
):
    eid = _post(client, team_a, _instruction(instruction_file)).json()["id"]
    url = f"/v1/evaluations/{eid}/export"
    r = client.get(url, headers=team_a.headers, params={"format": "alpaca_eval"})
    assert r.status_code == 409  # not succeeded yet
    _succeed(db_sessions, store, team_a, eid, _instruction_doc())
    r = client.get(url, headers=team_a.headers, params={"format": "alpaca_eval"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["generator"] == "job-9@step-40"
    assert body["leaderboard"]["job-9@step-40"]["n_total"] == 4
    assert body["provenance"]["truncated"]["truncated"] == 1
    params = {"format": "alpaca_eval", "part": "model_outputs", "name": "mine-1"}
    r = client.get(url, headers=team_a.headers, params=params)
    assert [set(o) for o in r.json()] == [{"instruction", "output", "generator"}] * 4
    assert {o["generator"] for o in r.json()} == {"mine-1"}
    r = client.get(
        url, headers=team_a.headers, params={"format": "alpaca_eval", "part": "leaderboard"}
    )
    assert r.headers["content-type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(r.text)))
    assert rows[0][1:3] == ["win_rate", "standard_error"] and rows[1][0] == "job-9@step-40"
    wrong = client.get(url, headers=team_a.headers, params={"format": "lighteval"})
    assert wrong.status_code == 409 and wrong.json()["error"]["field"] == "format"
    bad = client.get(url, headers=team_a.headers, params={"format": "csv"})
    assert bad.status_code == 422
    bad = client.get(url, headers=team_a.headers, params={"format": "alpaca_eval", "name": "a b"})
    assert bad.status_code == 422
    assert (
        client.get(url, headers=team_b.headers, params={"format": "alpaca_eval"}).status_code == 404
    )


def test_lighteval_export(client, team_a, math_file, eval_queue, db_sessions, store):
    eid = _post(client, team_a, _math(math_file)).json()["id"]
    _succeed(db_sessions, store, team_a, eid, _math_doc())
    url = f"/v1/evaluations/{eid}/export"
    r = client.get(url, headers=team_a.headers, params={"format": "lighteval"})
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    assert res["humanline|math_500|0"] == {
        "extractive_match": 0.5,
        "extractive_match_stderr": 0.2887,
    }
    assert r.json()["provenance"]["decoding"]["n"] == 2
    r = client.get(url, headers=team_a.headers, params={"format": "lighteval", "task": "addition"})
    assert "humanline|addition|0" in r.json()["results"]
