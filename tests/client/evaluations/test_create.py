"""client.evaluations.create (and retrieve): what the server keeps of a request, the
three ways to name the model, 422s with their field, eval-file checks, idempotent retries."""

from __future__ import annotations

from typing import Any

import pytest

from humanline_client import (
    ConflictError,
    Evaluation,
    NotFoundError,
    UnprocessableEntityError,
)

from .conftest import JUDGE, finished_job, math

# --- create ------------------------------------------------------------------------------------


def test_create_and_retrieve(client, eval_queue, math_file, instruction_file):
    ev = math(client, math_file, generation={"temperature": 0.2}, max_items=3)
    assert isinstance(ev, Evaluation) and ev.status == "queued" and not ev.is_terminal
    assert (ev.kind, ev.base_model, ev.job_id, ev.step, ev.file_id) == (
        "math",
        "tiny-llama",
        None,
        None,
        math_file,
    )
    assert ev.config["generation"] == {  # unset fields: the server's math defaults
        "n": 4,
        "temperature": 0.2,
        "top_p": 0.95,
        "max_new_tokens": 1024,
        "seed": 0,
    }
    assert ev.config["max_items"] == 3 and ev.metrics == {} and ev.result is None
    assert ev._request_id and eval_queue.ids == [ev.id]
    again = client.evaluations.retrieve(ev.id)
    assert again.to_dict() == ev.to_dict() and again.created_at is not None

    judged = client.evaluations.create(
        base_model="tiny-llama", file_id=instruction_file, kind="instruction", judge=JUDGE
    )
    assert judged.config["judge"] == JUDGE and judged.config["generation"]["n"] == 1
    rm = client.evaluations.create(
        base_model="tiny-llama",
        file_id=instruction_file,
        kind="instruction",
        judge={"type": "reward_model", "model": "armorm"},
    )
    assert rm.config["judge"] == {"type": "reward_model", "model": "armorm"}
    custom = math(
        client,
        math_file,
        prompt_template="Solve: {problem}",
        system_prompt="Be brief.",
        generation={"n": 8},
        extra_body={"max_items": 2},
    )
    assert custom.config["prompt_template"] == "Solve: {problem}"
    assert custom.config["generation"]["n"] == 8 and custom.config["max_items"] == 2
    assert eval_queue.ids == [ev.id, judged.id, rm.id, custom.id]


def test_evaluating_a_job_or_one_of_its_checkpoints(
    client, eval_queue, driver, train_file, math_file
):
    done = finished_job(client, driver, train_file)
    ev = math(client, math_file, job_id=done)
    assert ev.job_id == done and ev.base_model is None and ev.step is None
    at_step = math(client, math_file, job_id=done, step=2)
    assert at_step.step == 2 and at_step.config["step"] == 2

    running = finished_job(client, driver, train_file, final=False)
    with pytest.raises(ConflictError) as info:  # no exported final model yet
        math(client, math_file, job_id=running)
    assert info.value.field == "job_id"
    assert math(client, math_file, job_id=running, step=2).status == "queued"
    with pytest.raises(NotFoundError) as info:
        math(client, math_file, job_id=running, step=7)
    assert info.value.field == "step"


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"judge": {"type": "openai", "base_url": "http://evil.example/v1", "model": "m"}},
         "judge.base_url"),
        ({"judge": {"type": "reward_model", "model": "/etc/passwd"}}, "judge.model"),
        ({"judge": None}, "judge"),
        ({"generation": {"n": 2}}, "generation.n"),
        ({"generation": {"temperature": 5}}, "generation.temperature"),
        ({"prompt_template": "Q: {problem}"}, "prompt_template"),
        ({"step": 3}, "step"),
        ({"job_id": "job-x"}, "job_id"),  # a job and a base model
        ({"base_model": None}, "job_id"),  # neither
        ({"base_model": "gpt-5"}, "base_model"),
        ({"kind": "poetry"}, "kind"),
        ({"extra_body": {"surprise": 1}}, "surprise"),
    ],
)  # fmt: skip
def test_invalid_requests_raise_422_with_the_field(
    client, eval_queue, instruction_file, overrides, field
):
    kwargs: dict[str, Any] = {
        "base_model": "tiny-llama",
        "file_id": instruction_file,
        "kind": "instruction",
        "judge": JUDGE,
        **overrides,
    }
    with pytest.raises(UnprocessableEntityError) as info:
        client.evaluations.create(**kwargs)
    assert info.value.status_code == 422 and info.value.field == field, info.value
    assert info.value.message and eval_queue.ids == []


def test_the_eval_file_is_checked(client, eval_queue, train_file, math_file, instruction_file):
    for file_id, text in ((train_file, "purpose"), (instruction_file, "eval_math")):
        with pytest.raises(UnprocessableEntityError, match=text) as info:
            math(client, file_id)
        assert info.value.field == "file_id"
    with pytest.raises(NotFoundError) as info:
        math(client, "file-does-not-exist")
    assert info.value.field == "file_id"


def test_create_is_idempotent_across_retries(client, server, team, eval_queue, math_file):
    """The evaluation is created but the answer is lost: the retry carries the same
    Idempotency-Key and gets the original back, so there is one evaluation, not two."""
    token = server.faults.plan(("after", 503))
    faulty = client.with_options(default_headers={"X-Test-Fault": token})
    ev = math(faulty, math_file)
    seen = server.faults.seen[token]
    assert len(seen) == 2 and len({h["idempotency-key"] for h in seen}) == 1
    assert [e.id for e in client.evaluations.list()] == [ev.id] and eval_queue.ids == [ev.id]
    same = math(client, math_file, idempotency_key="eval-key-1")
    assert math(client, math_file, idempotency_key="eval-key-1").id == same.id
    with pytest.raises(ConflictError):  # the same key with another body
        math(client, math_file, idempotency_key="eval-key-1", max_items=1)
