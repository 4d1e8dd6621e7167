"""Dataset formats: detection, normalisation and line-numbered errors."""

import json

import pytest

from trainer.spec.data import JsonlValidator, iter_lines, MAX_LINE_BYTES, read_jsonl


def validate(lines):
    v = JsonlValidator()
    records = [r for r in (v.feed(x if isinstance(x, bytes) else json.dumps(x).encode()) for x in lines) if r]
    return v.finish(), records


def test_every_format_is_detected_and_normalised():
    msgs = [{"role": "user", "content": "hi"}]
    cases = {
        "preference": {"prompt": "p", "chosen": "a", "rejected": "b"},
        "unpaired": {"prompt": "p", "completion": "a", "label": False},
        "prompt": {"prompt": "p", "answer": 4, "difficulty": "easy"},
        "eval_instruction": {"instruction": "i", "output": "o"},
        "eval_math": {"problem": "1+1", "answer": 2, "level": 1},
    }
    for fmt, rec in cases.items():
        report, records = validate([rec])
        assert report.ok and report.format == fmt, fmt
    report, (rec,) = validate([{"input": {"messages": msgs}, "preferred_output": [{"role": "assistant", "content": "a"}], "non_preferred_output": [{"role": "assistant", "content": "b"}]}])
    assert report.format == "preference" and rec["prompt"] == msgs and rec["chosen"][0]["content"] == "a"
    report, (rec,) = validate([{"prompt": "p", "answer": 4, "difficulty": "easy"}])
    assert rec["answer"] == "4" and rec["difficulty"] == "easy"


@pytest.mark.parametrize(
    "line, field",
    [
        (b"{not json", "(json)"),
        (b"[1, 2]", "(json)"),
        (json.dumps({"a": 1}).encode(), "(columns)"),
        (json.dumps({"prompt": "p", "chosen": "", "rejected": "b"}).encode(), "chosen"),
        (json.dumps({"prompt": "p", "chosen": "a", "rejected": 3}).encode(), "rejected"),
        (json.dumps({"prompt": "p", "completion": "a", "label": "yes"}).encode(), "label"),
        (json.dumps({"prompt": [{"role": "bot", "content": "x"}], "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]}).encode(), "prompt[0].role"),
        (json.dumps({"prompt": "p", "chosen": [{"role": "assistant", "content": "a"}], "rejected": "b"}).encode(), "rejected"),
        (b"\xff\xfe{}", "(line)"),
        (json.dumps({"prompt": "p", "completion": "a", "label": True}).encode(), "(columns)"),  # mixed
    ],
)
def test_bad_lines_name_line_and_field(line, field):
    good = json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}).encode()
    if b'"yes"' in line:  # judge the label within an unpaired file
        good = json.dumps({"prompt": "p", "completion": "a", "label": True}).encode()
    report, records = validate([good, b"", line])
    assert not report.ok
    assert [(e.line, e.field) for e in report.errors] == [(3, field)]
    assert len(records) == 1


def test_empty_file_is_an_error_and_blank_lines_are_not():
    report, _ = validate([b"", b"  "])
    assert not report.ok and report.errors[0].field == "(file)"


def test_iter_lines_streams_and_cuts_overlong_lines():
    big = b"x" * (MAX_LINE_BYTES + 10)
    a, b = b'{"prompt": "a"}', b'{"prompt": "b"}'
    stream = [a + b"\n", big[: MAX_LINE_BYTES // 2], big[MAX_LINE_BYTES // 2 :] + b"\n", b]
    lines = list(iter_lines(stream))
    assert lines[0] == a and lines[-1] == b and len(lines) == 3
    v = JsonlValidator()
    for ln in lines:
        v.feed(ln)
    assert [(e.line, e.field) for e in v.report.errors] == [(2, "(line)")]
    assert "longer" in v.report.errors[0].message and v.report.records == 2


def test_read_jsonl_raises_with_line_numbers(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n{"prompt": "p"\n')
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(str(p))
