"""The official `openai` package drives jobs end to end through the embedded worker: a
humanline DPO job (upload with purpose fine-tune, create with extensions, follow to
`succeeded`, read its events, checkpoints and fine-tuned model), a supervised job with
OpenAI's fields only, and a reinforcement job on a file in OpenAI's own format graded by
string_check."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient
from openai.types.fine_tuning import FineTuningJob
from sqlalchemy import select

from api.main import create_app
from models.tables import Job, JobMetric
from models.teams import create_api_key
from tests.worker.conftest import jsonl, wait_for
from trainer.synthetic import preference_records
from worker import embedded

# OpenAI's own DPO layout: the conversation in input.messages, one preferred and one
# non-preferred assistant message
OPENAI_DPO = jsonl(
    [
        {
            "input": {"messages": [{"role": "user", "content": r["prompt"]}]},
            "preferred_output": [{"role": "assistant", "content": r["chosen"]}],
            "non_preferred_output": [{"role": "assistant", "content": r["rejected"]}],
        }
        for r in preference_records(32)
    ]
)


def test_openai_client_runs_a_dpo_job_to_success(local):
    with local.sessions() as s:
        _, secret = create_api_key(s, local.team_id)
        s.commit()
    http = TestClient(create_app(local.settings, session_factory=local.sessions))
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key=secret, http_client=http)
    embedded.start(local.settings)
    try:
        training = oai.files.create(file=("prefs.jsonl", OPENAI_DPO), purpose="fine-tune")
        assert training.status == "processed"
        job = oai.fine_tuning.jobs.create(
            model="tiny-llama",
            training_file=training.id,
            method={"type": "dpo", "dpo": {"hyperparameters": {"batch_size": 4}}},
            extra_body={
                "humanline": True,
                "spec": {
                    "max_steps": 3,
                    "max_length": 96,
                    "max_prompt_length": 48,
                    "quality_sample": 0,
                    "checkpoint_every": 2,
                },
            },
        )

        def finished():
            j = oai.fine_tuning.jobs.retrieve(job.id)
            return j if j.status in ("succeeded", "failed", "cancelled") else None

        done = FineTuningJob.model_validate(wait_for(finished, 300, 0.2, "the job").model_dump())
        assert done.status == "succeeded", done.error
        assert done.fine_tuned_model and done.fine_tuned_model.endswith(job.id)
        messages = [e.message for e in oai.fine_tuning.jobs.list_events(job.id, limit=100)]
        assert any("succeeded" in m for m in messages)
        steps = sorted(c.step_number for c in oai.fine_tuning.jobs.checkpoints.list(job.id))
        assert steps == [2, 3]
        assert oai.models.retrieve(done.fine_tuned_model).owned_by == local.team_id
    finally:
        embedded.stop()
        http.close()


# OpenAI's own supervised file: system, user and assistant turns, multi-turn, an assistant
# turn of weight 0 (context, not learned)
SUPERVISED = "".join(
    json.dumps(
        {
            "messages": [
                {"role": "system", "content": "You answer arithmetic questions."},
                {"role": "user", "content": f"What is {i} + {i}?"},
                {"role": "assistant", "content": "I am not sure.", "weight": 0},
                {"role": "user", "content": "Please try."},
                {"role": "assistant", "content": f"{i} + {i} = {2 * i}."},
            ]
            if i % 2
            else [
                {"role": "user", "content": f"What is {i} + {i}?"},
                {"role": "assistant", "content": f"{i} + {i} = {2 * i}."},
            ]
        }
    )
    + "\n"
    for i in range(8)
).encode()


def test_openai_client_runs_a_supervised_job_to_success(local):
    """OpenAI's default method, as a team's existing code calls it: only OpenAI's fields."""
    with local.sessions() as s:
        _, secret = create_api_key(s, local.team_id)
        s.commit()
    http = TestClient(create_app(local.settings, session_factory=local.sessions))
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key=secret, http_client=http)
    embedded.start(local.settings)
    try:
        training = oai.files.create(file=("chat.jsonl", SUPERVISED), purpose="fine-tune")
        assert training.status == "processed"
        hyper = {"n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 2.0}
        method: Any = {"type": "supervised", "supervised": {"hyperparameters": hyper}}
        job = oai.fine_tuning.jobs.create(
            model="tiny-llama",
            training_file=training.id,
            method=method,
            suffix="chat",
        )
        assert job.method is not None and job.method.type == "supervised"
        assert job.method.supervised and job.method.supervised.hyperparameters
        assert job.method.supervised.hyperparameters.n_epochs == 2

        def finished():
            j = oai.fine_tuning.jobs.retrieve(job.id)
            return j if j.status in ("succeeded", "failed", "cancelled") else None

        done = FineTuningJob.model_validate(wait_for(finished, 300, 0.2, "the job").model_dump())
        assert done.status == "succeeded", done.error
        assert done.fine_tuned_model and done.fine_tuned_model.endswith(job.id)
        with local.sessions() as s:
            spec = s.get(Job, job.id).spec
        assert spec["objective"]["name"] == "sft" and spec["epochs"] == 2
        assert spec["batch_size"] == 4 and spec["optim"]["lr"] == 2 * 2e-5
        steps = [c.step_number for c in oai.fine_tuning.jobs.checkpoints.list(job.id)]
        assert steps == [4]  # 8 conversations / 4 a step × 2 epochs
    finally:
        embedded.stop()
        http.close()


# OpenAI's reinforcement layout: the conversation so far in `messages`, the item's fields
# beside it. Half the items' answers are empty (every completion contains "": score 1), half
# a string a random tiny model never writes (score 0): the round's mean reward is 1/2 only if
# the grader rendered each line's own `{{item.answer}}`.
REINFORCEMENT = jsonl(
    [
        {
            "messages": [
                {"role": "system", "content": "Answer with one word."},
                {"role": "user", "content": f"Say the word number {i}."},
            ],
            "answer": "" if i % 2 else "qqzzqqzzqq",
            "id": f"item-{i}",
        }
        for i in range(8)
    ]
)


def test_openai_client_runs_a_reinforcement_job_in_openais_format(local):
    with local.sessions() as s:
        _, secret = create_api_key(s, local.team_id)
        s.commit()
    http = TestClient(create_app(local.settings, session_factory=local.sessions))
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key=secret, http_client=http)
    embedded.start(local.settings)
    try:
        training = oai.files.create(file=("rft.jsonl", REINFORCEMENT), purpose="fine-tune")
        assert training.status == "processed"
        grader = {
            "type": "string_check",
            "name": "contains the answer",
            "input": "{{ sample.output_text }}",
            "reference": "{{ item.answer }}",
            "operation": "ilike",
        }
        job = oai.fine_tuning.jobs.create(
            model="tiny-llama",
            training_file=training.id,
            method={
                "type": "reinforcement",
                "reinforcement": {"grader": grader, "hyperparameters": {"batch_size": 16}},
            },
            extra_body={
                "spec": {
                    "max_steps": 2,
                    "max_length": 160,
                    "max_prompt_length": 128,  # the chat template's tokens too
                    "quality_sample": 0,
                    "online": {
                        "num_samples": 2,
                        "max_new_tokens": 6,
                        "sample_every": 1,
                        "engine": "hf",
                        "zero_variance_groups": "keep",  # each item scores all 0 or all 1
                    },
                }
            },
        )
        assert job.method.reinforcement.grader.reference == "{{item.answer}}"

        def finished():
            j = oai.fine_tuning.jobs.retrieve(job.id)
            return j if j.status in ("succeeded", "failed", "cancelled") else None

        done = FineTuningJob.model_validate(wait_for(finished, 300, 0.2, "the job").model_dump())
        assert done.status == "succeeded", done.error
        with local.sessions() as s:
            rows = s.scalars(
                select(JobMetric).where(JobMetric.job_id == job.id).order_by(JobMetric.step)
            ).all()
        rounds = [r.values for r in rows if "round/index" in r.values]
        assert len(rounds) == 2
        for stats in rounds:  # >= 8 prompts a round (16 sequences in groups of 2): both kinds
            mean, prompts = stats["reward/string_check"], stats["round/prompts"]
            assert prompts >= 8 and 0 < mean < 1, stats
            # every completion of a prompt scores its item's own score: k of the prompts score 1
            assert mean * prompts == pytest.approx(round(mean * prompts)), stats
    finally:
        embedded.stop()
        http.close()
