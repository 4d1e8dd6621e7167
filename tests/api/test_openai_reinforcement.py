"""OpenAI's reinforcement files through the API: `{"messages": [...], <the item's fields>}`
lines are uploaded as prompt data (validated with line numbers), and a job whose grader reads
a field that some line lacks is refused at creation, naming the field and the line."""

from __future__ import annotations

import io
import json

import openai
import pytest

from api.uploads import ValidUpload, validate_upload
from contract.items import MAX_PROFILED_FIELDS, FieldProfile
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
        "nested": True,
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
    assert "supervised" in errors[0]["message"] and "answer" in errors[0]["message"]
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


def _profile(lines) -> tuple[FieldProfile | None, ValidUpload]:
    """The fields profile an upload of `lines` keeps (a bytes line is sent as it is)."""
    data = b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines)
    valid = validate_upload(io.BytesIO(data), purpose="train", max_bytes=1 << 30,
                            max_line_bytes=1 << 20)  # fmt: skip
    return FieldProfile.from_json(valid.fields), valid


def test_the_upload_profiles_which_lines_hold_which_fields():
    lines = [
        {"messages": [USER], "answer": "a", "id": 1, "note": "x"},
        b"",  # a blank line: not a record, still a line
        {"messages": [USER], "answer": "b", "note": None},  # line 3: no id; a null note
        {"messages": [USER], "answer": "c", "extra": 1},  # line 4: no id nor note
        {"prompt": "our own layout", "answer": "d"},  # the same format
    ]
    profile, valid = _profile(lines)
    assert valid.format == "prompt" and valid.records == 4 and profile is not None
    assert profile.first_line_without("answer") is None  # on every line
    assert profile.first_line_without("id") == 3
    assert profile.first_line_without("note") == 3  # null counts as absent
    assert profile.first_line_without("extra") == 1  # not on the first line
    assert profile.first_line_without("prompt") is None  # every record has its prompt
    assert FieldProfile.from_json(profile.as_json()) == profile  # as stored with the file
    assert FieldProfile.from_json(None) is None  # a file stored without one
    # a BOM before the first line changes no line number
    profile, _ = _profile([b"\xef\xbb\xbf" + json.dumps(lines[0]).encode(), lines[2]])
    assert profile is not None and profile.first_line_without("id") == 2
    # other formats are not profiled
    assert _profile([{"prompt": "p", "chosen": "a", "rejected": "b"}])[0] is None


def test_a_profile_past_its_tracked_fields_refuses_nothing_it_cannot_know():
    wide = {"messages": [USER], **{f"f{i}": i for i in range(MAX_PROFILED_FIELDS + 5)}}
    profile, _ = _profile([wide, {"messages": [USER], "f0": 0}])
    assert profile is not None and not profile.complete
    assert profile.first_line_without("f1") == 2  # tracked
    assert profile.checkable("f1") and not profile.checkable(f"f{MAX_PROFILED_FIELDS + 1}")
    assert profile.first_line_without(f"f{MAX_PROFILED_FIELDS + 1}") is None  # not known
    old = FieldProfile.from_json({"first_line": 1, "missing": {"a": None}})  # stored before
    assert old is not None and not old.nested and old.checkable("a.b")
    assert old.first_line_without("a.b") is None  # its top-level field, as it was checked


def test_nested_and_late_grader_fields_are_checked_on_every_line_at_create(oai, client, team_a):
    """Issue 37 #6: `{{item.a.b.c}}` and a field past the 64 once profiled passed admission
    when some line lacked them, and the job failed at its first reward, after sampling."""
    wide = {f"f{i}": i for i in range(100)}
    lines = [
        {"messages": [USER], "meta": {"a": {"b": {"c": "x"}}, "id": 1}, **wide},
        {"messages": [USER], "meta": {"a": {"b": {"c": "y"}}, "id": 2}, **wide},
        {"messages": [USER], "meta": {"a": {"b": {}}, "id": 3}, **wide},  # no meta.a.b.c
        {"messages": [USER], "meta": {"a": {"b": {"c": "z"}}, "id": 4}, "f0": 0},  # no f90
    ]
    file_id = _file(oai, lines)

    def create(reference: str):
        grader = {**GRADER, "reference": reference}
        with pytest.raises(openai.UnprocessableEntityError) as caught:
            oai.fine_tuning.jobs.create(
                model="tiny-llama", training_file=file_id, method=_job(grader)
            )
        return caught.value.body["message"]

    assert "line 3" in create("{{item.meta.a.b.c}}")
    assert "'meta.a.b.c'" in create("{{ item.meta.a.b.c }}")
    assert "line 4" in create("{{item.f90}}")
    assert "line 1" in create("{{item.meta.a.b.c.d}}")  # below a string: on no line
    job = oai.fine_tuning.jobs.create(
        model="tiny-llama",
        training_file=file_id,
        method=_job({**GRADER, "reference": "{{item.meta.id}}"}),
    )
    assert job.id
    # a path past what the upload tracked cannot be checked: refused, saying so
    huge = {"messages": [USER], **{f"g{i}": i for i in range(MAX_PROFILED_FIELDS + 5)}}
    big = upload(client, team_a, jsonl([huge, huge]), purpose="fine-tune").json()["id"]
    grader = {**GRADER, "reference": f"{{{{item.g{MAX_PROFILED_FIELDS + 1}}}}}"}
    with pytest.raises(openai.UnprocessableEntityError, match="cannot be checked"):
        oai.fine_tuning.jobs.create(model="tiny-llama", training_file=big, method=_job(grader))


def test_a_reinforcement_job_on_other_data_says_what_prompt_data_is(oai):
    preference = _file(oai, [{"prompt": "Q?", "chosen": "a", "rejected": "b"}])
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        oai.fine_tuning.jobs.create(model="tiny-llama", training_file=preference, method=_job())
    message = caught.value.body["message"]
    assert "is preference" in message and '{"messages": [...ending with the user turn]' in message
