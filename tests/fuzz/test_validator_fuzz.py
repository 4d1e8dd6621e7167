"""Property tests of the dataset validator (contract/data.py) and the upload endpoint.

Any byte string — random bytes, or near-valid JSONL made of mutated records — yields either a
valid report or line-numbered errors, never an exception (DESIGN.md §6: bad input never
yields a 500). Through the real endpoint: 201 or 4xx, never 5xx, and a refused upload leaves
no object and no row behind.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from contract.data import (
    EVAL_FORMATS,
    MAX_ERRORS,
    TRAIN_FORMATS,
    JsonlValidator,
    RecordError,
    iter_lines,
    parse_line,
)
from models.tables import File
from tests.api.conftest import stored_objects, upload

FUZZ_EXAMPLES = 2000
ENDPOINT_EXAMPLES = 200


def fuzz(examples: int, *allowed: HealthCheck):
    """Hypothesis settings of these tests: `examples` runs, no per-example deadline (a slow
    example is not a failure), the `allowed` health checks suppressed."""
    return settings(max_examples=examples, deadline=None, suppress_health_check=list(allowed))


# --- strategies: near-valid JSONL -------------------------------------------------------------

KEYS = [
    "prompt", "chosen", "rejected", "completion", "label", "answer", "instruction", "output",
    "generator", "problem", "level", "subject", "messages", "input", "preferred_output",
    "non_preferred_output", "role", "content", "",
]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "bot", ""])},
        optional={"content": st.one_of(st.text(max_size=10), scalars)},
    ),
    max_size=4,
)
values = st.recursive(
    st.one_of(scalars, messages),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)
    ),
    max_leaves=8,
)
VALID = [
    {"prompt": "Q?", "chosen": "good", "rejected": "bad"},
    {"prompt": "Q?", "completion": "A", "label": True},
    {"prompt": "Q?"},
    {"instruction": "Say hi", "output": "hi"},
    {"problem": "1+1?", "answer": "2"},
    {
        "prompt": [{"role": "user", "content": "hi"}],
        "chosen": [{"role": "assistant", "content": "a"}],
        "rejected": [{"role": "assistant", "content": "b"}],
    },
]


@st.composite
def records(draw) -> dict:
    """A valid record with keys dropped, retyped or added."""
    record = dict(draw(st.sampled_from(VALID)))
    for key in draw(st.lists(st.sampled_from(sorted(record)), max_size=2, unique=True)):
        if draw(st.booleans()):
            del record[key]
        else:
            record[key] = draw(values)
    record.update(draw(st.dictionaries(st.sampled_from(KEYS), values, max_size=2)))
    return record


def _render(item) -> bytes:
    if isinstance(item, bytes):
        return item
    try:
        return json.dumps(item, allow_nan=True).encode()
    except (ValueError, TypeError):
        return b"{}"


lines = st.one_of(
    records().map(_render),
    values.map(_render),
    st.binary(max_size=40),
    st.sampled_from([b"", b" ", b"\r", b"{", b"[]", b'"x"', b"\xff\xfe", b"\x00", b"NaN"]),
)
near_valid_files = st.lists(lines, max_size=12).map(lambda ls: b"\n".join(ls))
any_bytes = st.one_of(st.binary(max_size=300), near_valid_files)


def check_report(data: bytes, chunk: int, allowed) -> None:
    validator = JsonlValidator(allowed)
    seen = 0
    for raw in iter_lines(data[i : i + chunk] for i in range(0, max(len(data), 1), chunk)):
        seen += 1
        validator.feed(raw.rstrip(b"\r"))
    report = validator.finish()
    assert report.error_count >= len(report.errors)
    assert len(report.errors) <= MAX_ERRORS
    if report.ok:
        assert report.format in allowed and report.records > 0 and not report.errors
    else:
        assert report.errors, "an invalid file must say why"
        for err in report.errors:
            assert 1 <= err.line <= max(seen, 1), (err, seen)
            assert err.field and err.message
        assert [e.line for e in report.errors] == sorted(e.line for e in report.errors)
    # the lines iter_lines yields are exactly the file's lines
    assert seen == (data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1))


@fuzz(FUZZ_EXAMPLES, HealthCheck.too_slow, HealthCheck.data_too_large)
@given(
    data=any_bytes,
    chunk=st.integers(min_value=1, max_value=64),
    allowed=st.sampled_from([TRAIN_FORMATS, EVAL_FORMATS, TRAIN_FORMATS + EVAL_FORMATS]),
)
def test_validator_never_raises_on_any_bytes(data: bytes, chunk: int, allowed) -> None:
    check_report(data, chunk, allowed)


@fuzz(FUZZ_EXAMPLES // 2)
@given(raw=lines)
def test_parse_line_raises_only_record_errors(raw: bytes) -> None:
    try:
        fmt, record = parse_line(raw, None)
    except RecordError as err:
        assert err.field and err.message
        return
    assert isinstance(record, dict) and fmt in TRAIN_FORMATS + EVAL_FORMATS


def test_fuzzed_inputs_that_once_mattered() -> None:
    for data in [b"", b"\n\n", b"\xff", b'{"prompt": 1e999}', b'{"prompt": NaN}', b"[" * 5000]:
        check_report(data, 7, TRAIN_FORMATS)


# --- through the real upload endpoint ---------------------------------------------------------


def test_upload_endpoint_never_5xx_and_leaves_nothing_on_4xx(
    client, team_a, store, db_sessions
) -> None:
    outcomes: dict[int, int] = {}

    @fuzz(ENDPOINT_EXAMPLES, HealthCheck.function_scoped_fixture, HealthCheck.too_slow)
    @given(
        data=any_bytes,
        purpose=st.sampled_from(["train", "eval"]),
        filename=st.text(max_size=40),
    )
    def run(data: bytes, purpose: str, filename: str) -> None:
        before_objects = stored_objects(store)
        with db_sessions() as s:
            before_rows = s.execute(select(func.count()).select_from(File)).scalar_one()
        r = upload(client, team_a, data, purpose=purpose, filename=filename or "x.jsonl")
        outcomes[r.status_code] = outcomes.get(r.status_code, 0) + 1
        assert r.status_code < 500, r.text
        with db_sessions() as s:
            after_rows = s.execute(select(func.count()).select_from(File)).scalar_one()
        if r.status_code == 201:
            assert after_rows == before_rows + 1
            assert len(stored_objects(store)) == len(before_objects) + 1
        else:
            assert 400 <= r.status_code < 500
            body = r.json()
            assert "error" in body or "detail" in body, body
            assert after_rows == before_rows
            assert stored_objects(store) == before_objects

    run()
    assert sum(outcomes.values()) >= ENDPOINT_EXAMPLES // 2, outcomes


def test_deeply_nested_json_is_a_422_not_a_500(client, team_a, store) -> None:
    """Regression (found by the fuzzer): json.loads raised RecursionError on '[[[[...'."""
    r = upload(client, team_a, b'{"prompt": ' + b"[" * 3000 + b"\n")
    assert r.status_code == 422, r.text
    assert "nested too deeply" in r.text
    assert stored_objects(store) == []


def test_nul_characters_in_requests_are_422_not_500(client, team_a, store) -> None:
    """Regression (found by schemathesis): PostgreSQL refuses NUL in text and JSON values;
    `GET /v1/files?after=%00` was a 500. (PostgreSQL: tests/fuzz/conftest.py.)"""
    h = team_a.headers
    unstorable = "cannot be stored or searched"
    for path in ("/v1/files", "/v1/jobs", "/v1/evaluations"):
        r = client.get(path, headers=h, params={"after": "\x00\xa1"})
        assert r.status_code == 422 and unstorable in r.text, (path, r.status_code, r.text)
    for path in ("/v1/files/file-%00", "/v1/jobs/job-%00", "/v1/evaluations/eval-%00"):
        r = client.get(path, headers=h)
        assert r.status_code == 422 and unstorable in r.text, (path, r.status_code, r.text)
    file_id = upload(client, team_a).json()["id"]
    objects = stored_objects(store)
    body = {"base_model": "tiny-llama", "training_file": file_id, "objective": "dpo"}
    for extra, says in (
        ({"metadata": {"k": "a\x00b"}}, unstorable),
        ({"training_file": "file-\x00"}, unstorable),
        ({"metadata": {"\x00": "v"}}, "metadata keys are"),
    ):
        r = client.post("/v1/jobs", headers=h, json={**body, **extra})
        assert r.status_code == 422 and says in r.text, (extra, r.status_code, r.text)
    assert stored_objects(store) == objects
    # in a file's content a NUL is data: JSONL allows it, and it is never a database value
    r = upload(client, team_a, b'{"prompt": "a\\u0000", "chosen": "b", "rejected": "c"}\n')
    assert r.status_code == 201 and r.json()["records"] == 1, r.text
