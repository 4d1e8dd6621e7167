"""The `openai` package against our /v1: files, fine_tuning.jobs and models, every object
validated against the SDK's own types. Jobs are driven through the state machine as a worker
would (tests/worker/test_openai_end_to_end.py runs a real one)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types import FileObject, Model
from openai.types.fine_tuning import FineTuningJob, FineTuningJobEvent
from openai.types.fine_tuning.jobs import FineTuningJobCheckpoint

from api import openai_compat
from models import jobs as job_states
from models.tables import Job
from tests.api.conftest import PREFERENCE, jsonl

CHAT_LINE = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello.", "weight": 0},
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2."},
    ]
}
CHAT = jsonl([CHAT_LINE, CHAT_LINE])  # OpenAI's supervised format
PROMPTS = jsonl([{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(4)])
DPO = {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2, "batch_size": 2, "n_epochs": 3}}}
# OpenAI's exact-match grader: the sampled text against the prompt row's `answer`
EXACT = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.answer}}",
    "operation": "eq",
}


@pytest.fixture
def oai(client, team_a):
    sdk = openai.OpenAI(
        base_url="http://testserver/v1", api_key=team_a.key, http_client=client, max_retries=0
    )
    yield sdk


def _strict(model_cls, obj):
    """Validate what the SDK parsed (it builds objects without validation) against its type."""
    return model_cls.model_validate(obj.model_dump(exclude_unset=False, warnings=False))


def _spec(db_sessions, job_id: str) -> dict:
    with db_sessions() as s:
        return s.get(Job, job_id).spec


def _upload(oai, content=PREFERENCE) -> FileObject:
    f = oai.files.create(file=("prefs.jsonl", content), purpose="fine-tune")
    return _strict(FileObject, f)


def test_files_take_openais_purpose_and_read_as_its_file_object(oai):
    f = _upload(oai)
    assert f.purpose == "fine-tune" and f.status == "processed" and f.bytes == len(PREFERENCE)
    assert isinstance(f.created_at, int)
    assert oai.files.retrieve(f.id).id == f.id
    assert [x.id for x in oai.files.list(purpose="fine-tune")] == [f.id]


def test_a_dpo_job_runs_through_its_life_with_the_sdks_types(oai, db_sessions, queue):
    training = _upload(oai)
    job = oai.fine_tuning.jobs.create(
        model="tiny-llama",
        training_file=training.id,
        method=DPO,
        seed=7,
        suffix="exp1",
        extra_body={"humanline": {"sync_every": 2}, "spec": {"max_steps": 4}},
    )
    job = _strict(FineTuningJob, job)
    assert job.status == "queued" and job.model == "tiny-llama" and job.seed == 7
    assert job.method.type == "dpo" and job.method.dpo.hyperparameters.beta == 0.2
    assert job.fine_tuned_model is None and queue.job_ids == [job.id]
    # the same row the native API shows, with the mapped spec
    spec = _spec(db_sessions, job.id)
    assert (spec["objective"]["name"], spec["objective"]["beta"]) == ("dpo", 0.2)
    assert (spec["humanline"], spec["humanline_params"]["sync_every"]) == (True, 2)
    assert (spec["batch_size"], spec["epochs"], spec["max_steps"]) == (2, 3, 4)

    with db_sessions() as s:  # a worker runs it: claim, metrics, a checkpoint, success
        assert job_states.claim(s, job.id, "w1", 60) is not None
        job_states.record_metrics(s, job.id, 2, {"loss": 0.5})
        job_states.add_checkpoint(s, job.id, 2, "p/", bytes=10)
        result = {"tokens_trained": 123, "final_model": {"prefix": "p/final/", "files": ["x"]}}
        assert job_states.finish(s, job.id, "w1", "succeeded", result=result)
        s.commit()

    done = _strict(FineTuningJob, oai.fine_tuning.jobs.retrieve(job.id))
    assert done.status == "succeeded" and done.trained_tokens == 123
    assert done.fine_tuned_model == f"ft:tiny-llama:{done.organization_id}:exp1:{job.id}"
    events = [_strict(FineTuningJobEvent, e) for e in oai.fine_tuning.jobs.list_events(job.id)]
    assert events and events[0].created_at >= events[-1].created_at  # newest first
    assert any("succeeded" in e.message for e in events)
    page = oai.fine_tuning.jobs.list_events(job.id, limit=1)
    assert page.has_more and len(page.data) == 1
    second = oai.fine_tuning.jobs.list_events(job.id, limit=1, after=page.data[0].id)
    assert second.data[0].id != page.data[0].id
    (ckpt,) = [
        _strict(FineTuningJobCheckpoint, c) for c in oai.fine_tuning.jobs.checkpoints.list(job.id)
    ]
    assert ckpt.step_number == 2 and ckpt.metrics.train_loss == 0.5
    assert [j.id for j in oai.fine_tuning.jobs.list()] == [job.id]
    model = _strict(Model, oai.models.retrieve(done.fine_tuned_model))
    assert model.id == done.fine_tuned_model
    ids = [m.id for m in oai.models.list()]
    assert "tiny-llama" in ids and done.fine_tuned_model in ids


def test_cancel_and_paging(oai):
    training = _upload(oai)
    jobs = [
        oai.fine_tuning.jobs.create(model="tiny-llama", training_file=training.id, method=DPO)
        for _ in range(3)
    ]
    cancelled = _strict(FineTuningJob, oai.fine_tuning.jobs.cancel(jobs[0].id))
    assert cancelled.status == "cancelled"
    with pytest.raises(openai.ConflictError):
        oai.fine_tuning.jobs.cancel(jobs[0].id)
    first = oai.fine_tuning.jobs.list(limit=2)
    assert [j.id for j in first.data] == [jobs[2].id, jobs[1].id] and first.has_more
    rest = oai.fine_tuning.jobs.list(limit=2, after=first.data[-1].id)
    assert [j.id for j in rest.data] == [jobs[0].id] and not rest.has_more
    assert [j.id for j in oai.fine_tuning.jobs.list(limit=1)] == [j.id for j in reversed(jobs)]


def test_reinforcement_with_a_string_check_grader_is_online_grpo(oai, db_sessions):
    prompts = _upload(oai, PROMPTS)
    job = oai.fine_tuning.jobs.create(
        model="tiny-llama",
        training_file=prompts.id,
        method={"type": "reinforcement", "reinforcement": {"grader": EXACT}},
    )
    job = _strict(FineTuningJob, job)
    assert job.method.type == "reinforcement"
    assert job.method.reinforcement.grader.operation == "eq"
    spec = _spec(db_sessions, job.id)
    assert spec["objective"]["name"] == "grpo" and spec["data_source"] == "online"
    assert spec["max_steps"] == 1  # one pass over 4 prompts: 64 sequences = 8 prompts a step
    assert spec["online"]["rewards"] == [
        {"name": "string_check", "weight": 1.0, "options": {"operation": "eq", "field": "answer"}}
    ]


@pytest.mark.parametrize(
    ("method", "param", "says"),
    [
        (
            {"type": "supervised", "supervised": {"hyperparameters": {"beta": 0.1}}},
            "method.supervised.hyperparameters.beta",
            "dpo hyperparameter",
        ),
        (
            {
                "type": "reinforcement",
                "reinforcement": {"grader": {"type": "python", "source": "x"}},
            },
            "method.reinforcement.grader",
            "string_check",
        ),
        *(
            (
                {"type": "reinforcement", "reinforcement": {"grader": {"type": kind}}},
                "method.reinforcement.grader",
                f"grader type {kind!r} is not supported",
            )
            for kind in ("python", "score_model", "label_model", "text_similarity", "multi")
        ),
        (  # a sample variable other than the completion's text
            {
                "type": "reinforcement",
                "reinforcement": {"grader": {**EXACT, "reference": "{{sample.output_json}}"}},
            },
            "method.reinforcement.grader",
            "only {{sample.output_text}}",
        ),
        (  # a grader that never reads the completion
            {
                "type": "reinforcement",
                "reinforcement": {"grader": {**EXACT, "input": "{{item.answer}}"}},
            },
            "method.reinforcement.grader",
            "put {{sample.output_text}} in its input",
        ),
        (
            {
                "type": "reinforcement",
                "reinforcement": {"grader": {**EXACT, "operation": "regex"}},
            },
            "method.reinforcement.grader.operation",
            "unknown string_check operation 'regex'",
        ),
    ],
)
def test_unsupported_methods_are_openai_shaped_400s(oai, method, param, says):
    training = _upload(oai)
    with pytest.raises(openai.BadRequestError) as caught:
        oai.fine_tuning.jobs.create(model="tiny-llama", training_file=training.id, method=method)
    error = caught.value.body
    assert caught.value.status_code == 400 and error["param"] == param and says in error["message"]
    assert error["type"] == "invalid_request_error" and "code" in error


def test_supervised_is_the_default_method_and_maps_to_sft(oai, db_sessions):
    chat = _upload(oai, CHAT)
    hyper = {"n_epochs": 3, "batch_size": 2, "learning_rate_multiplier": 0.5}
    job = _strict(
        FineTuningJob,
        oai.fine_tuning.jobs.create(
            model="tiny-llama",
            training_file=chat.id,
            method={"type": "supervised", "supervised": {"hyperparameters": hyper}},
        ),
    )
    assert job.method.type == "supervised" and job.method.supervised is not None
    assert job.method.supervised.hyperparameters.n_epochs == 3
    spec = _spec(db_sessions, job.id)
    assert spec["objective"] == {"name": "sft", "packing": False}
    assert (spec["epochs"], spec["batch_size"], spec["optim"]["lr"]) == (3, 2, 0.5 * 2e-5)
    # no method: OpenAI's default, with its deprecated top-level hyperparameters
    legacy = oai.fine_tuning.jobs.create(
        model="tiny-llama", training_file=chat.id, hyperparameters={"n_epochs": 2}
    )
    assert legacy.method is not None and legacy.method.type == "supervised"
    assert _spec(db_sessions, legacy.id)["epochs"] == 2
    # packing, our extension, rides in the spec's objective
    packed = oai.fine_tuning.jobs.create(
        model="tiny-llama",
        training_file=chat.id,
        extra_body={"spec": {"objective": {"packing": True}}},
    )
    assert _spec(db_sessions, packed.id)["objective"] == {"name": "sft", "packing": True}
    # humanline and online sampling do not apply to SFT: the spec says why, naming the field
    with pytest.raises(openai.BadRequestError) as caught:
        oai.fine_tuning.jobs.create(
            model="tiny-llama", training_file=chat.id, extra_body={"humanline": True}
        )
    body: Any = caught.value.body
    assert body["param"] == "variant" and "reference" in caught.value.message
    # a preference file is not SFT data
    prefs = _upload(oai)
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        oai.fine_tuning.jobs.create(model="tiny-llama", training_file=prefs.id)
    body = refused.value.body
    assert body["param"] == "training_file" and "sft" in refused.value.message


def test_tool_calling_files_are_refused_at_upload_with_the_line(oai):
    bad = CHAT + jsonl([{**CHAT_LINE, "tools": [{"type": "function"}]}])
    with pytest.raises(openai.APIStatusError) as caught:
        _upload(oai, bad)
    assert caught.value.status_code in (400, 422)
    assert "line 3" in str(caught.value.body) and "tools" in str(caught.value.body)


def test_missing_method_and_clashing_extensions_are_400s(oai):
    training = _upload(oai)
    with pytest.raises(openai.BadRequestError, match="set seed once"):
        oai.fine_tuning.jobs.create(
            model="tiny-llama",
            training_file=training.id,
            method=DPO,
            seed=1,
            extra_body={"spec": {"seed": 2}},
        )
    with pytest.raises(openai.BadRequestError) as caught:  # the spec's own checks, with the field
        oai.fine_tuning.jobs.create(
            model="tiny-llama",
            training_file=training.id,
            method=DPO,
            extra_body={"spec": {"max_steps": 0}},
        )
    assert caught.value.body["param"] == "max_steps"


def test_other_teams_jobs_and_models_are_404(client, oai, team_b):
    training = _upload(oai)
    job = oai.fine_tuning.jobs.create(model="tiny-llama", training_file=training.id, method=DPO)
    other = openai.OpenAI(
        base_url="http://testserver/v1", api_key=team_b.key, http_client=client, max_retries=0
    )
    with pytest.raises(openai.NotFoundError):
        other.fine_tuning.jobs.retrieve(job.id)
    with pytest.raises(openai.NotFoundError):
        other.models.retrieve(f"ft:tiny-llama:x::{job.id}")
    assert list(other.fine_tuning.jobs.list()) == []


def test_idempotency_key_returns_the_original_job(oai):
    training = _upload(oai)
    kwargs = {"model": "tiny-llama", "training_file": training.id, "method": DPO}
    first = oai.fine_tuning.jobs.create(**kwargs, extra_headers={"Idempotency-Key": "k1"})
    again = oai.fine_tuning.jobs.create(**kwargs, extra_headers={"Idempotency-Key": "k1"})
    assert again.id == first.id
    assert len(list(oai.fine_tuning.jobs.list())) == 1


def test_event_ids_round_trip():
    assert openai_compat.event_seq("ftevent-job-abc-17") == 17
    assert openai_compat.event_seq("ftevent-job-abc-1٧") is None  # a non-ASCII digit


def test_auto_hyperparameters_keep_our_defaults_and_the_multiplier_scales_the_lr(oai, db_sessions):
    from contract.spec import DPOConfig

    training = _upload(oai)
    hp = {"batch_size": "auto", "n_epochs": "auto", "beta": "auto", "learning_rate_multiplier": 2}
    job = oai.fine_tuning.jobs.create(
        model="tiny-llama",
        training_file=training.id,
        method={"type": "dpo", "dpo": {"hyperparameters": hp}},
    )
    spec = _spec(db_sessions, job.id)
    assert spec["optim"]["lr"] == pytest.approx(2 * DPOConfig.default_lr)
    assert spec["epochs"] == 1 and spec["objective"]["beta"] == DPOConfig().beta
    with pytest.raises(openai.UnprocessableEntityError):
        oai.fine_tuning.jobs.create(
            model="tiny-llama",
            training_file=training.id,
            method={"type": "dpo", "dpo": {"hyperparameters": {"batch_size": 0}}},
        )


def test_reinforcement_steps_count_prompts_not_sequences(oai, db_sessions):
    """n_epochs passes over the prompts: batch 16 sequences of groups of 4 = 4 prompts a step."""
    prompts = _upload(
        oai, jsonl([{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(12)])
    )
    job = oai.fine_tuning.jobs.create(
        model="tiny-llama",
        training_file=prompts.id,
        method={
            "type": "reinforcement",
            "reinforcement": {
                "grader": EXACT,
                "hyperparameters": {"batch_size": 16, "n_epochs": 2},
            },
        },
        extra_body={"spec": {"online": {"num_samples": 4}}},
    )
    assert _spec(db_sessions, job.id)["max_steps"] == 6  # 2 × ceil(12 / 4)


GRPO_BODY = {
    "model": "tiny-llama",
    "method": {"type": "reinforcement", "reinforcement": {"grader": EXACT}},
}


@pytest.mark.parametrize(
    ("spec", "param"),
    [
        ('{"online": "x"}', "online"),
        ('{"online": ["x"]}', "online"),
        ('{"online": {"num_samples": "a"}}', "online.num_samples"),
        ('{"online": {"num_samples": {"a": 1}}}', "online.num_samples"),
        ('{"online": {"num_samples": 1e400}}', "online.num_samples"),
        ('{"online": {"num_samples": 0}}', "online.num_samples"),
        ('{"online": {"num_samples": -3}}', "online.num_samples"),
        ('{"online": {"num_samples": true}}', "online.num_samples"),
    ],
)
def test_bad_online_values_in_spec_are_400s_naming_the_field(
    client, oai, team_a, db_sessions, queue, spec, param
):
    """A reinforcement job without spec.max_steps counts its steps from spec.online's
    num_samples before JobSpec has validated it: .get() of a string, int() of "a", of a
    dict, of 1e400 (infinity) and a division by 0 were 500s."""
    training = _upload(oai, PROMPTS)
    body = json.dumps({**GRPO_BODY, "training_file": training.id})[:-1]
    r = client.post(
        "/v1/fine_tuning/jobs",
        headers={**team_a.headers, "Content-Type": "application/json"},
        content=f'{body}, "spec": {spec}}}',
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert queue.job_ids == []


def test_a_response_that_cannot_be_rendered_leaves_no_fine_tuning_job(
    app, team_a, oai, db_sessions, queue, monkeypatch
):
    """The response is rendered before the commit: a failure there leaves no job committed
    and enqueued behind a 500."""
    from fastapi.testclient import TestClient

    import api.routes.fine_tuning as routes

    def unrenderable(*args, **kwargs):
        raise TypeError("cannot render")

    training = _upload(oai)
    monkeypatch.setattr(routes, "JSONResponse", unrenderable)
    r = TestClient(app, raise_server_exceptions=False).post(
        "/v1/fine_tuning/jobs",
        headers=team_a.headers,
        json={"model": "tiny-llama", "training_file": training.id, "method": DPO},
    )
    assert r.status_code == 500
    assert queue.job_ids == []
    with db_sessions() as s:
        assert s.query(Job).count() == 0


def _succeed(db_sessions, job_id: str, result: dict) -> None:
    with db_sessions() as s:
        assert job_states.claim(s, job_id, "w1", 60) is not None
        assert job_states.finish(s, job_id, "w1", "succeeded", result=result)
        s.commit()


def test_only_a_job_that_exported_a_model_has_one(oai, db_sessions):
    """A succeeded job has a model only when its result names one (result.final_model), as
    its download and evaluations require: /v1/models listed every succeeded job."""
    training = _upload(oai)
    bare, exported = (
        oai.fine_tuning.jobs.create(model="tiny-llama", training_file=training.id, method=DPO)
        for _ in range(2)
    )
    _succeed(db_sessions, bare.id, {"tokens_trained": 5})
    _succeed(db_sessions, exported.id, {"final_model": {"prefix": "p/final/", "files": ["x"]}})
    bare_job = _strict(FineTuningJob, oai.fine_tuning.jobs.retrieve(bare.id))
    assert bare_job.status == "succeeded" and bare_job.fine_tuned_model is None
    model = _strict(FineTuningJob, oai.fine_tuning.jobs.retrieve(exported.id)).fine_tuned_model
    assert model == f"ft:tiny-llama:{bare_job.organization_id}::{exported.id}"
    ids = [m.id for m in oai.models.list()]
    assert model in ids and not any(i.endswith(bare.id) for i in ids)
    assert oai.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve(f"ft:tiny-llama:{bare_job.organization_id}::{bare.id}")


def test_event_levels_follow_the_events_our_code_writes(oai, db_sessions):
    """A failure is the `status` event of the move to failed (models.jobs.transition), a
    warning a `warning` event (trainer, worker): the levels OpenAI's SDK shows."""
    training = _upload(oai)
    job = oai.fine_tuning.jobs.create(model="tiny-llama", training_file=training.id, method=DPO)
    with db_sessions() as s:
        assert job_states.claim(s, job.id, "w1", 60) is not None
        job_states.add_event(s, job.id, "warning", "some examples were truncated", {})
        error = {"type": "training_failed", "message": "CUDA out of memory"}
        assert job_states.finish(s, job.id, "w1", "failed", error=error, message="out of memory")
        s.commit()
    events = [_strict(FineTuningJobEvent, e) for e in oai.fine_tuning.jobs.list_events(job.id)]
    levels = {e.message: e.level for e in events}
    assert levels["out of memory"] == "error" and levels["some examples were truncated"] == "warn"
    assert [e.level for e in events].count("error") == 1
    assert {e.type for e in events} == {"message"}
    others = [e.level for e in events if e.level not in ("error", "warn")]
    assert others == ["info"] * 3  # created, validating → queued, queued → running


@pytest.mark.parametrize(
    "hyperparameters,field",
    [
        ({"n_epochs": True}, "method.supervised.hyperparameters.n_epochs"),
        ({"batch_size": False}, "method.supervised.hyperparameters.batch_size"),
        (
            {"learning_rate_multiplier": float("inf")},
            "method.supervised.hyperparameters.learning_rate_multiplier",
        ),
    ],
)
def test_booleans_and_non_finite_hyperparameters_are_422s(client, team_a, hyperparameters, field):
    """Issue 37 #7: `true` is not 1 epoch, Infinity no multiplier (written as Python's json
    writes them: the JSON has no such numbers)."""
    body = {
        "model": "tiny-llama", "training_file": "file-x",
        "method": {"type": "supervised", "supervised": {"hyperparameters": hyperparameters}},
    }  # fmt: skip
    headers = {**team_a.headers, "content-type": "application/json"}
    r = client.post("/v1/fine_tuning/jobs", headers=headers, content=json.dumps(body))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"].startswith(field)  # a union names its branch after it
