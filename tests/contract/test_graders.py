"""OpenAI's grader templates and string_check, by hand (contract.graders, contract.rewards)."""

import pytest
from pydantic import ValidationError

from contract.graders import TemplateError, item_fields, render, string_check, variables
from contract.rewards import RewardSpec


@pytest.mark.parametrize(
    ("operation", "input", "reference", "holds"),
    [
        ("eq", "Paris", "Paris", True),
        ("eq", "Paris", "paris", False),  # case-sensitive
        ("eq", "Paris.", "Paris", False),  # equality, not containment
        ("ne", "Paris", "paris", True),
        ("ne", "Paris", "Paris", False),
        ("like", "It is Paris.", "Paris", True),  # contains
        ("like", "It is PARIS.", "Paris", False),  # case-sensitive
        ("like", "Par", "Paris", False),  # the input contains the reference, not the reverse
        ("ilike", "It is PARIS.", "paris", True),  # contains, ignoring case
        ("ilike", "It is Lyon.", "paris", False),
        ("like", "anything", "", True),  # the empty string is in every string
    ],
)
def test_string_check_operations(operation, input, reference, holds):
    assert string_check(operation, input, reference) is holds


def test_string_check_refuses_an_unknown_operation():
    with pytest.raises(ValueError, match="eq, ne, like, ilike"):
        string_check("regex", "a", "a")


def test_templates_render_the_sample_and_the_items_fields():
    item = {"answer": 42, "city": "Paris", "meta": {"id": "q7", "ok": True}, "tags": ["a"]}
    assert render("{{sample.output_text}}", "  out ", item) == "  out "
    assert render("{{ item.city }}", "x", item) == "Paris"  # spaces inside the braces
    assert render("The answer is {{item.answer}}.", "x", item) == "The answer is 42."  # JSON
    assert render("{{item.meta.id}}/{{item.meta.ok}}", "x", item) == "q7/true"  # nested
    assert render("{{item.tags}}", "x", item) == '["a"]'
    assert render("no variables", "x", item) == "no variables"
    # what the sample says is text, never a template rendered in turn
    assert render("{{sample.output_text}}", "{{item.city}}", item) == "{{item.city}}"


@pytest.mark.parametrize(
    ("template", "missing"),
    [
        ("{{item.answer}}", "item.answer"),
        ("{{item.meta.nope}}", "item.meta.nope"),
        ("{{item.nothing}}", "item.nothing"),  # null counts as absent
        ("{{item.meta.id.deeper}}", "item.meta.id.deeper"),  # a string has no fields
    ],
)
def test_a_missing_field_is_named(template, missing):
    item = {"nothing": None, "meta": {"id": "q7"}}
    with pytest.raises(KeyError) as caught:
        render(template, "x", item)
    assert caught.value.args[0] == missing


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{{sample.output_json}}", "only {{sample.output_text}}"),
        ("{{sample.choices}}", "only {{sample.output_text}}"),
        ("{{answer}}", "is not a template variable"),
        ("{{ }}", "is not a template variable"),
        ("{{item.a-b}}", "is not a template variable"),
        ("{{row.answer}}", "unknown namespace 'row'"),
    ],
)
def test_variables_outside_item_and_sample_text_are_refused(template, says):
    with pytest.raises(TemplateError, match=says.replace("{", r"\{").replace("}", r"\}")):
        variables(template)


def test_item_fields_are_the_top_level_fields_read():
    assert item_fields(
        "{{sample.output_text}}", "{{item.answer}} {{item.meta.id}} {{item.answer}}"
    ) == [
        "answer",
        "meta",
    ]


def test_a_string_check_reward_spec_is_checked_and_names_its_fields():
    short = RewardSpec(name="string_check", options={"field": "label"})
    assert short.item_fields() == ["label"]
    full = RewardSpec(
        name="string_check",
        options={"operation": "like", "input": "{{sample.output_text}}", "reference": "{{item.x}}"},
    )
    assert full.item_fields() == ["x"]
    assert RewardSpec(name="format").item_fields() == []
    for options, says in [
        ({"operation": "regex", "field": "a"}, "not one of eq, ne, like, ilike"),
        ({"reference": "{{sample.output_json}}"}, "only"),
        ({"input": "{{item.a}}", "reference": "{{item.b}}"}, "must read the completion"),
        ({"field": "a", "reference": "{{item.b}}"}, "not both"),
        ({"field": "a b"}, "column name"),
        ({"reference": 4}, "template string"),
        ({"field": "a", "flavour": 1}, "no option 'flavour'"),
    ]:
        with pytest.raises(ValidationError, match=says):
            RewardSpec(name="string_check", options=options)
