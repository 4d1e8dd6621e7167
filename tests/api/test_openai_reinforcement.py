"""OpenAI's reinforcement files through the API: `{"messages": [...], <the item's fields>}`
lines are uploaded as prompt data (validated with line numbers), and a job whose grader reads
a field that some line lacks is refused at creation, naming the field and the line."""

from __future__ import annotations

import openai
import pytest

from models.tables import File
from tests.api.conftest import jsonl, upload

USER = {"role": "user", "content": "Capital of France?"}
LINES = [
    {"messages": [{"role": "system", "content": "One word."}, USER], "answer": "Paris", "id": i}
    for i in range(4)
]
GRADER = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.answer}}",
    "operation": "eq",
}


def _job(grader=GRADER) -> dict:
    return {"type": "reinforcement", "reinforcement": {"grader": grader}}


@pytest.fixture
def oai(client, team_a):
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key=team_a.key, http_client=client, max_retries=0
    )


def _file(oai, lines) -> str:
    return oai.files.create(file=("rft.jsonl", jsonl(lines)), purpose="fine-tune").id


def test_an_openai_reinforcement_file_uploads_as_prompt_data(client, team_a, db_sessions):
    r = upload(client, team_a, jsonl(LINES), purpose="fine-tune")
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["format"], body["records"], body["warnings"]) == ("prompt", 4, [])
    assert body["error"] is None  # the fields profile is not shown as an error
    with db_sessions() as s:  # which lines hold which fields, kept with the row
        fields = s.get(File, body["id"]).item_fields
    assert fields == {
        "first_line": 1,
        "missing": {"answer": None, "id": None},
        "complete": True,
    }


def test_bad_lines_are_refused_with_their_line_numbers(client, team_a, store):
    bad = [
        LINES[0],
        {"messages": [USER, {"role": "assistant", "content": "Paris"}], "answer": "Paris"},
        LINES[1],
        {"messages": [{"role": "system", "content": "x"}], "answer": "Paris"},
        {"messages": [USER], "tools": []},
    ]
    r = upload(client, team_a, jsonl(bad), purpose="fine-tune")
    assert r.status_code == 422, r.text
    errors = r.json()["error"]["errors"]
    assert [(e["line"], e["field"]) for e in errors] == [
        (2, "messages[1].role"),
        (4, "messages"),
        (5, "tools"),
    ]
    assert "end with the user turn" in errors[0]["message"]
    assert "no user turn" in errors[1]["message"]
    assert "line 2: messages[1].role" in r.json()["error"]["message"]
    assert not any(p.endswith(".jsonl") for p in store_keys(store))  # nothing kept


def store_keys(store) -> list[str]:
    from pathlib import Path

    return [str(p) for p in Path(store.root).rglob("*") if p.is_file()]


def test_a_job_whose_grader_reads_a_field_some_line_lacks_is_refused(oai, db_sessions):
    lines = [*LINES[:2], {"messages": [USER], "id": 9}, LINES[3]]  # line 3 has no answer
    file_id = _file(oai, lines)
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        oai.fine_tuning.jobs.create(model="tiny-llama", training_file=file_id, method=_job())
    error = caught.value.body
    assert "'answer'" in error["message"] and "line 3" in error["message"], error
    assert error["param"] == "online.rewards.0.options"
    # a field no line has: missing from the first line
    other = {**GRADER, "reference": "The capital is {{ item.capital }}."}
    with pytest.raises(openai.UnprocessableEntityError, match=r"line 1 .* no field 'capital'"):
        oai.fine_tuning.jobs.create(model="tiny-llama", training_file=file_id, method=_job(other))
    # a field every line has: created, the templates kept as OpenAI's grader reads them
    by_id = {**GRADER, "input": "#{{sample.output_text}}", "reference": "#{{item.id}}"}
    job = oai.fine_tuning.jobs.create(model="tiny-llama", training_file=file_id, method=_job(by_id))
    grader = job.method.reinforcement.grader
    assert (grader.input, grader.reference) == ("#{{sample.output_text}}", "#{{item.id}}")


def test_native_jobs_check_grader_fields_and_templates_too(client, team_a):
    file_id = upload(client, team_a, jsonl([*LINES, {"messages": [USER], "id": 5}])).json()["id"]

    def create(options):
        body = {
            "base_model": "tiny-llama",
            "training_file": file_id,
            "objective": "grpo",
            "variant": "online",
            "max_steps": 1,
            "online": {"rewards": [{"name": "string_check", "options": options}]},
        }
        return client.post("/v1/jobs", headers=team_a.headers, json=body)

    r = create({"field": "answer"})
    assert r.status_code == 422 and "line 5" in r.json()["error"]["message"], r.text
    r = create({"reference": "{{sample.output_json}}"})
    assert r.status_code == 422 and "only {{sample.output_text}}" in r.text, r.text
    assert create({"field": "id", "operation": "ne"}).status_code == 201
