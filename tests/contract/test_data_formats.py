"""Dataset formats: detection, normalisation and line-numbered errors."""

import json

import pytest

from contract.data import (
    MAX_ERRORS_PER_LINE,
    MAX_LINE_BYTES,
    JsonlValidator,
    RecordError,
    iter_lines,
    parse_line,
    read_jsonl,
)


def validate(lines):
    v = JsonlValidator()
    records = [
        r
        for r in (v.feed(x if isinstance(x, bytes) else json.dumps(x).encode()) for x in lines)
        if r
    ]
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
    report, (rec,) = validate(
        [
            {
                "input": {"messages": msgs},
                "preferred_output": [{"role": "assistant", "content": "a"}],
                "non_preferred_output": [{"role": "assistant", "content": "b"}],
            }
        ]
    )
    assert (
        report.format == "preference"
        and rec["prompt"] == msgs
        and rec["chosen"][0]["content"] == "a"
    )
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
        (
            json.dumps(
                {
                    "prompt": [{"role": "bot", "content": "x"}],
                    "chosen": [{"role": "assistant", "content": "a"}],
                    "rejected": [{"role": "assistant", "content": "b"}],
                }
            ).encode(),
            "prompt[0].role",
        ),
        (
            json.dumps(
                {"prompt": "p", "chosen": [{"role": "assistant", "content": "a"}], "rejected": "b"}
            ).encode(),
            "rejected",
        ),
        (b"\xff\xfe{}", "(line)"),
        (  # mixed
            json.dumps({"prompt": "p", "completion": "a", "label": True}).encode(),
            "(columns)",
        ),
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


def test_a_bom_is_skipped_before_the_first_line_only(tmp_path):
    """The BOM case the API accepted and the trainer refused: one validator, one answer."""
    line = b'{"prompt": "p", "chosen": "a", "rejected": "b"}'
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + line + b"\r\n" + line + b"\r\n")
    fmt, records = read_jsonl(str(p))
    assert fmt == "preference" and len(records) == 2 and records[0]["prompt"] == "p"
    # A BOM anywhere else is not a byte-order mark: that line is malformed.
    p.write_bytes(line + b"\n\xef\xbb\xbf" + line + b"\n")
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(str(p))


def test_a_tighter_line_limit_names_the_line():
    v = JsonlValidator(max_line_bytes=20)
    v.feed(b'{"prompt": "short"}')
    v.feed(b'{"prompt": "far too long for twenty bytes"}')
    assert [(e.line, e.field) for e in v.report.errors] == [(2, "(line)")]
    assert "longer than 20 bytes" in v.report.errors[0].message and v.report.records == 1


# --- what users trust the validator to catch (issue 15 §4) ---------------------------------


@pytest.mark.parametrize(
    "record",
    [
        {"prompt": "Q", "chosen": "same", "rejected": "same"},
        {
            "prompt": [{"role": "user", "content": "Q"}],
            "chosen": [{"role": "assistant", "content": "A"}],
            "rejected": [{"role": "assistant", "content": "A"}],
        },
        {
            "input": {"messages": [{"role": "user", "content": "Q"}]},
            "preferred_output": [{"role": "assistant", "content": "A"}],
            "non_preferred_output": [{"role": "assistant", "content": "A"}],
        },
    ],
)
def test_a_pair_whose_answers_are_identical_is_refused(record):
    ok = {"prompt": "Q", "chosen": "a", "rejected": "b"}
    report, _ = validate([ok, record])
    assert not report.ok
    (err,) = report.errors
    assert err.line == 2 and err.field in ("rejected", "non_preferred_output")
    assert "identical" in err.message


@pytest.mark.parametrize("text", ["", "   ", "\u200b", "\x00\x01\n", "\ufeff \u200e\t", "\x7f"])
def test_text_with_nothing_visible_is_empty(text):
    report, _ = validate([{"prompt": "Q", "chosen": text, "rejected": "b"}])
    assert [(e.line, e.field) for e in report.errors] == [(1, "chosen")]
    assert "empty" in report.errors[0].message


def test_visible_text_with_controls_around_it_is_kept():
    """Kept as written: the validator judges emptiness, it does not strip the text."""
    record = {"prompt": "\u200bQ\n", "chosen": "\ta", "rejected": "b\x00"}
    report, records = validate([record])
    assert report.ok and records == [record]


def test_every_error_of_a_line_is_reported_with_its_field():
    report, _ = validate([{"prompt": 3, "chosen": "", "rejected": None}])
    assert [(e.line, e.field) for e in report.errors] == [
        (1, "prompt"),
        (1, "chosen"),
        (1, "rejected"),
    ]
    report, _ = validate([{"prompt": "", "completion": 5, "label": "yes"}])
    assert [e.field for e in report.errors] == ["prompt", "completion", "label"]
    report, _ = validate(
        [
            {
                "input": {"messages": []},
                "preferred_output": " ",
                "non_preferred_output": [{"role": "bot", "content": "y"}],
            }
        ]
    )
    assert [e.field for e in report.errors] == [
        "input.messages",
        "preferred_output",
        "non_preferred_output[0].role",
    ]


def test_every_bad_message_is_an_error_up_to_the_cap_per_line():
    bad = [{"role": "bot", "content": ""}] * 3 + [{"role": "user", "content": "ok"}, "hi"]
    report, _ = validate([{"prompt": bad, "chosen": "a", "rejected": "b"}])
    assert [e.field for e in report.errors] == [
        "prompt[0].role", "prompt[0].content", "prompt[1].role", "prompt[1].content",
        "prompt[2].role", "prompt[2].content", "prompt[4]",
    ]  # fmt: skip
    many = [{"role": "bot", "content": "x"}] * (MAX_ERRORS_PER_LINE + 5)
    report, _ = validate([{"prompt": many, "chosen": "a", "rejected": "b"}, {"prompt": many}])
    assert [e.line for e in report.errors] == [1] * MAX_ERRORS_PER_LINE + [2] * MAX_ERRORS_PER_LINE
    assert report.error_count == 2 * MAX_ERRORS_PER_LINE


def test_unknown_columns_are_warnings_not_errors():
    report, _ = validate(
        [
            {"prompt": "Q", "chosen": "a", "rejected": "b", "score": 3},
            {"prompt": "Q", "chosen": "a", "rejected": "b", "score": 4, "source": "web"},
            {"prompt": "Q", "chosen": "a", "rejected": "c"},
        ]
    )
    assert report.ok and report.records == 3
    assert report.warnings == [
        "line 1: unknown column 'score' is ignored",
        "line 2: unknown column 'source' is ignored",
    ]
    prompts, _ = validate([{"prompt": "Q", "answer": "1", "difficulty": "easy"}])
    assert prompts.ok and prompts.warnings == []  # extra columns reach reward functions


def test_jsonl_reader_streams_records_with_offsets_and_fails_at_the_end(tmp_path):
    """The trainer's reader (contract.data.JsonlReader): one record at a time, each with its
    line's byte offset (record_at reads it again, BOM and CRLF handled), and a file with a
    bad line raises ValueError listing it once the records before it were read."""
    from contract.data import JsonlReader, record_at

    good = tmp_path / "good.jsonl"
    good.write_bytes(
        b'\xef\xbb\xbf{"prompt": "a", "chosen": "b", "rejected": "c"}\r\n\n'
        b'{"prompt": "x", "chosen": "y", "rejected": "z"}\n'
    )
    reader = JsonlReader(str(good))
    assert reader.first() == "preference"
    seen = [(reader.offset, r) for r in reader]
    assert [o for o, _ in seen] == [0, 53] and reader.records == 2
    with open(good, "rb") as fh:
        assert [record_at(fh, o, "preference") for o, _ in seen] == [r for _, r in seen]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": 1}\n')
    reader = JsonlReader(str(bad))
    records = []
    with pytest.raises(ValueError, match="line 2"):
        for record in reader:
            records.append(record)
    assert len(records) == 1
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no records"):
        JsonlReader(str(empty)).first()


def test_an_unknown_format_names_its_keys_printably_even_a_lone_surrogate():
    """A key of "\\ud800" (valid JSON, no valid UTF-8) went into the error message raw: the
    API could not encode the 422 that carried it and answered 500."""
    report, _ = validate([b'{"\\ud800": 1, "b\\u00e9": 2}'])
    (error,) = report.errors  # a lone surrogate is refused as such (issue 37), named escaped
    assert error.field == "'\\ud800'" and "lone UTF-16 surrogate" in error.message
    (error.field + error.message).encode("utf-8")  # no lone surrogate left in either
    report, _ = validate([b'{"b\\u00e9": 2, "\\ud83d\\ude00": 1}'])  # a pair is fine
    (error,) = report.errors
    assert error.field == "(columns)" and "'bé'" in error.message


# --- OpenAI's reinforcement layout: messages + the item's fields ------------------------------

SYSTEM = {"role": "system", "content": "Answer briefly."}
USER = {"role": "user", "content": "Capital of France?"}


def test_openai_reinforcement_lines_are_prompt_data_with_their_fields():
    line = {"messages": [SYSTEM, USER], "answer": 7, "meta": {"id": "q1"}, "city": "Paris"}
    report, (record,) = validate([line])
    assert report.ok and report.format == "prompt" and report.warnings == []
    # the messages are the prompt; every other field is kept for the graders
    assert record == {
        "prompt": [SYSTEM, USER],
        "answer": "7",
        "meta": {"id": "q1"},
        "city": "Paris",
    }
    # multi-turn: earlier assistant turns are context, the last turn is the user's
    turns = [USER, {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "Why?"}]
    report, (record,) = validate([{"messages": turns}])
    assert report.ok and record["prompt"] == turns
    # OpenAI's developer role is a system turn
    developer = {"role": "developer", "content": "Answer briefly."}
    report, (record,) = validate([{"messages": [developer, USER], "answer": "Paris"}])
    assert report.ok and record["prompt"] == [SYSTEM, USER]
    # a prompt file of our own layout and one of OpenAI's are one format
    report, _ = validate([{"prompt": "p"}, {"messages": [USER]}])
    assert report.ok  # both are the prompt format


@pytest.mark.parametrize(
    ("line", "field", "says"),
    [
        ({"messages": []}, "messages", "non-empty list"),
        ({"messages": "Capital of France?"}, "messages", "non-empty list"),
        ({"messages": [SYSTEM]}, "messages", "has no user turn"),
        ({"messages": [USER, {"role": "assistant", "content": "Paris"}]}, "messages[1].role",
         "the last turn is an assistant turn"),
        ({"messages": [USER, {"role": "robot", "content": "x"}]}, "messages[1].role", "one of"),
        ({"messages": [{"role": "user", "content": ""}]}, "messages[0].content", "empty"),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "must be a string"),
        ({"messages": [USER], "tools": [{"type": "function"}]}, "tools", "not supported"),
        ({"messages": [USER], "answer": ["a", "b"]}, "answer", "string or a number"),
    ],
)  # fmt: skip
def test_bad_openai_reinforcement_lines_are_refused_with_their_line(line, field, says):
    good = {"messages": [USER], "answer": "Paris"}
    report, records = validate([good, line, good])
    assert not report.ok and len(records) == 2
    (error,) = report.errors
    assert (error.line, error.field) == (2, field) and says in error.message, error


def test_messages_ending_with_the_assistant_are_supervised_and_a_mix_says_what_to_change():
    answered = {"messages": [USER, {"role": "assistant", "content": "Paris"}]}
    report, _ = validate([answered])
    assert report.ok and report.format == "sft"
    report, _ = validate([answered, {"messages": [USER], "answer": "Paris"}])
    (error,) = report.errors
    assert (error.line, error.field) == (2, "messages[0].role")
    assert "supervised" in error.message and "assistant's answer" in error.message


# --- OpenAI's list-of-parts content and the developer role (issue 37) ------------------------


def test_text_parts_are_joined_and_developer_is_system_in_sft_and_rft_alike():
    parts = [{"type": "text", "text": "Capital of"}, {"type": "text", "text": "France?"}]
    sft = {"messages": [
        {"role": "developer", "content": "One word."},
        {"role": "user", "content": parts},
        {"role": "assistant", "content": [{"type": "text", "text": "Paris"}]},
    ]}  # fmt: skip
    fmt, record = parse_line(json.dumps(sft), None)
    assert fmt == "sft" and record["messages"] == [
        {"role": "system", "content": "One word."},
        {"role": "user", "content": "Capital of\nFrance?"},
        {"role": "assistant", "content": "Paris"},
    ]
    rft = {"messages": sft["messages"][:2], "answer": "Paris"}
    fmt, record = parse_line(json.dumps(rft), None)
    assert fmt == "prompt" and record["prompt"] == record_prompt(sft)


def record_prompt(sft: dict) -> list[dict]:
    return parse_line(json.dumps(sft), None)[1]["messages"][:2]


@pytest.mark.parametrize(
    "content,field",
    [
        (
            [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}],
            "messages[1].content[0].type",
        ),
        ([{"type": "text", "text": "a"}, {"type": "input_audio"}], "messages[1].content[1].type"),
        ([{"type": "text", "text": 3}], "messages[1].content[0].text"),
        (["plain"], "messages[1].content[0]"),
        ([], "messages[1].content"),
    ],
)
def test_other_content_parts_are_refused_naming_the_part(content, field):
    for last in ("assistant", "user"):  # SFT, and a reinforcement prompt
        line = {"messages": [
            {"role": "system", "content": "s"}, {"role": "user", "content": content},
            {"role": last, "content": "a"},
        ], "answer": "x"}  # fmt: skip
        if last == "assistant":
            line.pop("answer")
        with pytest.raises(RecordError) as caught:
            parse_line(json.dumps(line), None)
        assert caught.value.field == field, (last, caught.value)
