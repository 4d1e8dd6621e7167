"""Online jobs over HTTP: prompt files, and reward models only from the operator's list."""

from __future__ import annotations

from tests.api.conftest import job_body, jsonl, upload

PROMPTS = jsonl([{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)])


def _online(file_id: str, **online) -> dict:
    return job_body(
        file_id,
        variant="online+humanline",
        objective="grpo",
        max_steps=4,
        online=online,
        batch_size=None,  # the default: whole groups of online.num_samples
    )


def test_online_job_trains_on_a_prompt_file(client, team_a, train_file):
    prompts = upload(client, team_a, PROMPTS).json()["id"]
    ok = client.post("/v1/jobs", headers=team_a.headers, json=_online(prompts))
    assert ok.status_code == 201, ok.text
    assert ok.json()["spec"]["online"]["rewards"][-1]["name"] == "math_accuracy"  # paper default
    # a preference file is offline data: an online job refuses it, naming the field
    bad = client.post("/v1/jobs", headers=team_a.headers, json=_online(train_file))
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "training_file"


def test_reward_model_paths_come_from_the_allow_list(client, team_a, settings):
    prompts = upload(client, team_a, PROMPTS).json()["id"]
    rm = {"name": "reward_model", "options": {"path": "/etc"}}
    refused = client.post("/v1/jobs", headers=team_a.headers, json=_online(prompts, rewards=[rm]))
    assert refused.status_code == 422
    assert refused.json()["error"]["field"] == "online.rewards.0.options.path"
    settings.ALLOWED_REWARD_MODELS = "/models/armo-rm"
    rm["options"]["path"] = "/models/armo-rm"
    allowed = client.post("/v1/jobs", headers=team_a.headers, json=_online(prompts, rewards=[rm]))
    assert allowed.status_code == 201, allowed.text


def test_unregistered_reward_is_a_422_with_its_field(client, team_a):
    prompts = upload(client, team_a, PROMPTS).json()["id"]
    r = client.post(
        "/v1/jobs", headers=team_a.headers, json=_online(prompts, rewards=[{"name": "exec"}])
    )
    assert r.status_code == 422
    assert "unknown reward" in r.text and "online" in r.json()["error"]["field"]


def test_job_evaluations_are_checked_at_submission(client, team_a, team_b, train_file):
    from tests.api.conftest import EVAL_MATH

    mine = upload(client, team_a, EVAL_MATH, purpose="eval").json()["id"]
    theirs = upload(client, team_b, EVAL_MATH, purpose="eval").json()["id"]
    ok = client.post(
        "/v1/jobs",
        headers=team_a.headers,
        json=job_body(train_file, evaluations=[{"file_id": mine, "kind": "math"}]),
    )
    assert ok.status_code == 201, ok.text
    cases = [
        ([{"file_id": theirs, "kind": "math"}], 404, "evaluations.0.file_id"),
        (
            [
                {"file_id": mine, "kind": "math"},
                {
                    "file_id": mine,
                    "kind": "instruction",
                    "judge": {"type": "reward_model", "model": "armorm"},
                },
            ],
            422,
            "evaluations.1.file_id",
        ),
        ([{"file_id": mine, "kind": "instruction"}], 422, "evaluations"),  # needs a judge
    ]
    for evaluations, status, field in cases:
        r = client.post(
            "/v1/jobs", headers=team_a.headers, json=job_body(train_file, evaluations=evaluations)
        )
        assert r.status_code == status, (evaluations, r.text)
        assert r.json()["error"]["field"].startswith(field), r.json()


def test_async_online_jobs_are_admitted_with_their_resolved_lag(client, team_a, settings):
    prompts = upload(client, team_a, PROMPTS).json()["id"]
    ok = client.post("/v1/jobs", headers=team_a.headers, json=_online(prompts, mode="async"))
    assert ok.status_code == 201, ok.text
    online = ok.json()["spec"]["online"]
    assert (online["mode"], online["lag"]) == ("async", 1)  # the default lag, resolved

    def refused(field: str, **kw) -> str:
        body = _online(prompts, **kw.pop("online", {}))
        body.update(kw)
        r = client.post("/v1/jobs", headers=team_a.headers, json=body)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["field"] == field, r.json()
        return r.json()["error"]["message"]

    assert "cap of 4" in refused("online.lag", online={"mode": "async", "lag": 5})
    assert "mode 'async'" in refused("online", online={"lag": 2})  # a lag needs async
    refused("online", objective="kto", online={"mode": "async"})
    refused("online.is_cap", online={"mode": "async", "is_cap": -1})
    two_nodes = {"nodes": 2, "processes_per_node": 1, "strategy": "fsdp"}
    assert "one node" in refused("parallelism", online={"mode": "async"}, parallelism=two_nodes)
    settings.ONLINE_ASYNC = False
    assert "cannot place a sampler" in refused("online.mode", online={"mode": "async"})
