"""SFT in the contract: the spec (no humanline, no online, no reference), the sft training
formats with line-numbered errors, and a memory estimate that prices no reference model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from contract.data import JsonlValidator
from contract.memory import BUILTIN_SHAPES, estimate_training_memory
from contract.spec import JobSpec


def spec(**kw) -> JobSpec:
    return JobSpec.model_validate(
        {"base_model": "tiny-llama", "training_file": "f", "objective": "sft", **kw}
    )


def validate(lines):
    v = JsonlValidator()
    records = [r for r in (v.feed(json.dumps(x).encode()) for x in lines) if r]
    return v.finish(), records


# ---- the spec ----------------------------------------------------------------------------------
def test_sft_spec_resolves_without_a_reference():
    s = spec(objective={"name": "sft", "packing": True}).resolved()
    assert s.objective.name == "sft" and s.objective.packing is True
    assert not s.needs_reference and s.sync == "none" and s.batch_unit == "examples"
    assert s.rows_per_example == 1 and s.training_formats == ("sft",)
    assert spec().lr == 2e-5 and spec().global_batch_size == 32
    assert JobSpec.model_validate(s.model_dump()) == s  # the stored spec round-trips


@pytest.mark.parametrize(
    "kw, field, words",
    [
        ({"variant": "offline+humanline"}, "variant", "reference model"),
        ({"humanline": True}, "variant", "humanline"),
        ({"variant": "online", "max_steps": 4}, "online", "online sampling"),
        ({"data_source": "online", "max_steps": 4}, "online", "online sampling"),
        ({"reference_sync": "trust_region"}, "reference_sync", "no reference model"),
    ],
)
def test_humanline_and_online_do_not_apply_to_sft(kw, field, words):
    with pytest.raises(ValidationError) as err:
        spec(**kw)
    (e,) = err.value.errors()
    assert e["loc"] == (field,) and words in e["msg"], e


def test_the_estimate_prices_no_reference_and_one_row_per_example():
    shape = BUILTIN_SHAPES["tiny-llama"]
    sft = estimate_training_memory(spec(batch_size=8, grad_accum=1), shape, device="cuda")
    dpo = estimate_training_memory(
        spec(objective="dpo", batch_size=8, grad_accum=1), shape, device="cuda"
    )
    assert sft.parts["reference"] == 0 and dpo.parts["reference"] > 0
    # a DPO pair is two rows, an SFT example one (on a GPU: no shared-prompt layout)
    assert dpo.parts["activations"] == pytest.approx(2 * sft.parts["activations"], rel=0.01)


# ---- the formats ---------------------------------------------------------------------------------
CHAT: dict[str, list[dict[str, Any]]] = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "weight": 0},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "weight": 1},
    ]
}


def test_sft_lines_are_detected_and_normalised():
    report, (rec,) = validate([CHAT])
    assert report.ok and report.format == "sft"
    assert rec["messages"][2] == {"role": "assistant", "content": "Hello", "weight": 0}
    assert rec["messages"][0] == {"role": "system", "content": "Be brief."}
    # prompt/completion (no label: that is KTO's) in the same file: the same format
    report, recs = validate([CHAT, {"prompt": "p", "completion": "c"}])
    assert report.ok and report.format == "sft" and recs[1] == {"prompt": "p", "completion": "c"}
    msgs = [{"role": "user", "content": "p"}]
    done = [{"role": "assistant", "content": "c"}]
    report, (rec,) = validate([{"prompt": msgs, "completion": done}])
    assert report.ok and rec == {"prompt": msgs, "completion": done}
    # unpaired stays unpaired; messages ending with a user turn are not SFT data
    assert validate([{"prompt": "p", "completion": "c", "label": True}])[0].format == "unpaired"
    report, _ = validate([{"messages": msgs}])
    assert report.format != "sft"


@pytest.mark.parametrize(
    "line, field, words",
    [
        ({**CHAT, "tools": [{"type": "function"}]}, "tools", "not supported"),
        ({**CHAT, "functions": []}, "functions", "not supported"),
        (
            {
                "messages": [
                    *CHAT["messages"][:4],
                    {"role": "tool", "content": "x"},
                    CHAT["messages"][4],
                ]
            },
            "messages[4].role",
            "not supported",
        ),
        (
            {"messages": [*CHAT["messages"][:4], {**CHAT["messages"][4], "tool_calls": []}]},
            "messages[4].tool_calls",
            "not supported",
        ),
        (
            {"messages": [*CHAT["messages"][:4], {**CHAT["messages"][4], "weight": 0.5}]},
            "messages[4].weight",
            "0 or 1",
        ),
        (
            {"messages": [{**CHAT["messages"][1], "weight": 1}, CHAT["messages"][4]]},
            "messages[0].weight",
            "only assistant",
        ),
        (
            {"messages": [CHAT["messages"][1], {**CHAT["messages"][4], "weight": 0}]},
            "messages",
            "nothing to learn",
        ),
        ({"messages": [CHAT["messages"][4]]}, "messages[0].role", "opens with"),
        (
            {"messages": [{"role": "user", "content": " "}, CHAT["messages"][4]]},
            "messages[0].content",
            "empty",
        ),
        (
            {"prompt": "p", "completion": [{"role": "user", "content": "c"}]},
            "completion[0].role",
            "assistant",
        ),
    ],
)
def test_bad_sft_lines_name_the_line_and_field(line, field, words):
    report, _ = validate([CHAT, line])
    assert not report.ok
    errors = [e for e in report.errors if e.field == field]
    assert errors and errors[0].line == 2 and words in errors[0].message, report.errors
