"""/v1/evaluations: creation and its checks (field paths), the judge allow-lists and the key,
idempotency, enqueue-after-commit, listing, team isolation and the stored reports."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from sqlalchemy import func, select, update

from models import jobs as job_states
from models.tables import Evaluation, Job
from storage.keys import checkpoint_prefix, job_prefix, report_key
from tests.api.conftest import EVAL_MATH, job_body, jsonl, upload

EVAL_INSTRUCTION = jsonl([{"instruction": f"Say {i}.", "output": f"{i}."} for i in range(3)])
JUDGE_URL = "http://judge.internal:8000/v1"
SECRET = "sk-very-secret-judge-key"


@dataclass
class RecordingEvalQueue:
    sessions: object
    ids: list[str] = field(default_factory=list)
    seen_status: dict[str, str] = field(default_factory=dict)
    fail: bool = False

    def enqueue(self, evaluation_id: str) -> None:
        if self.fail:
            raise ConnectionError("broker down")
        with self.sessions() as s:  # another session: sees committed rows only
            self.seen_status[evaluation_id] = s.execute(
                select(Evaluation.status).where(Evaluation.id == evaluation_id)
            ).scalar_one()
        self.ids.append(evaluation_id)


@pytest.fixture(autouse=True)
def eval_env(settings):
    """The operator's evaluation settings (fields of Settings)."""
    settings.EVAL_JUDGE_BASE_URLS = f"{JUDGE_URL}/, http://other:1/v1"
    settings.EVAL_JUDGE_API_KEY = SECRET
    settings.EVAL_REWARD_MODELS = "armorm=/models/armorm,tiny=/models/tiny"


@pytest.fixture
def eval_queue(app, db_sessions) -> RecordingEvalQueue:
    app.state.eval_queue = RecordingEvalQueue(db_sessions)
    return app.state.eval_queue


@pytest.fixture
def math_file(client, team_a) -> str:
    r = upload(client, team_a, EVAL_MATH, purpose="eval")
    assert r.status_code == 201, r.text
    return r.json()["id"]


@pytest.fixture
def instruction_file(client, team_a) -> str:
    r = upload(client, team_a, EVAL_INSTRUCTION, purpose="eval")
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _post(client, team, body, **headers):
    return client.post("/v1/evaluations", headers={**team.headers, **headers}, json=body)


def _math(file_id, **kw):
    return {"base_model": "tiny-llama", "file_id": file_id, "kind": "math", **kw}


def _instruction(file_id, **kw):
    judge = {"type": "openai", "base_url": JUDGE_URL, "model": "gpt-4.1"}
    return {
        "base_model": "tiny-llama",
        "file_id": file_id,
        "kind": "instruction",
        "judge": judge,
        **kw,
    }


def _job(
    client, team, db_sessions, *, succeeded: bool = True, checkpoint_step: int | None = None
) -> str:
    train = upload(client, team).json()["id"]
    job = client.post("/v1/jobs", headers=team.headers, json=job_body(train)).json()
    with db_sessions() as s:
        if checkpoint_step is not None:
            job_states.add_checkpoint(
                s,
                job["id"],
                checkpoint_step,
                checkpoint_prefix(team.id, job["id"], checkpoint_step),
            )
        if succeeded:
            s.execute(
                update(Job)
                .where(Job.id == job["id"])
                .values(
                    status="succeeded",
                    result={
                        "final_model": {
                            "prefix": job_prefix(team.id, job["id"]) + "final/",
                            "files": [],
                        }
                    },
                )
            )
        s.commit()
    return job["id"]


# --- create ---------------------------------------------------------------------------------------


def test_create_a_math_evaluation_of_a_base_model(client, team_a, math_file, eval_queue):
    r = _post(client, team_a, _math(math_file, generation={"temperature": 0.2}))
    assert r.status_code == 201, r.text
    ev = r.json()
    assert ev["object"] == "evaluation" and ev["status"] == "queued" and ev["kind"] == "math"
    assert ev["base_model"] == "tiny-llama" and ev["job_id"] is None and ev["step"] is None
    # unset generation fields take the math defaults
    assert ev["config"]["generation"] == {
        "n": 4,
        "temperature": 0.2,
        "top_p": 0.95,
        "max_new_tokens": 1024,
        "seed": 0,
    }
    assert ev["config"]["file"]["format"] == "eval_math" and ev["config"]["judge"] is None
    assert eval_queue.ids == [ev["id"]] and eval_queue.seen_status[ev["id"]] == "queued"
    assert client.get(f"/v1/evaluations/{ev['id']}", headers=team_a.headers).json() == ev


def test_create_an_instruction_evaluation_the_key_is_never_stored_or_returned(
    client, team_a, instruction_file, eval_queue, db_sessions
):
    r = _post(client, team_a, _instruction(instruction_file))
    assert r.status_code == 201, r.text
    ev = r.json()
    assert ev["config"]["judge"] == {"type": "openai", "base_url": JUDGE_URL, "model": "gpt-4.1"}
    assert ev["config"]["generation"]["n"] == 1 and ev["config"]["generation"]["temperature"] == 0.0
    assert SECRET not in r.text
    with db_sessions() as s:
        row = s.get(Evaluation, ev["id"])
        assert SECRET not in json.dumps(row.config) + json.dumps(row.result)
    listing = client.get("/v1/evaluations", headers=team_a.headers)
    assert SECRET not in listing.text


def test_a_reward_model_judge_by_configured_name(client, team_a, instruction_file, eval_queue):
    body = _instruction(instruction_file, judge={"type": "reward_model", "model": "armorm"})
    r = _post(client, team_a, body)
    assert r.status_code == 201, r.text
    assert r.json()["config"]["judge"] == {"type": "reward_model", "model": "armorm"}  # no path


@pytest.mark.parametrize(
    "judge,field",
    [
        (
            {"type": "openai", "base_url": "http://attacker.example/v1", "model": "m"},
            "judge.base_url",
        ),
        (
            {"type": "openai", "base_url": "http://169.254.169.254/latest", "model": "m"},
            "judge.base_url",
        ),
        ({"type": "reward_model", "model": "/etc/passwd"}, "judge.model"),
        ({"type": "reward_model", "model": "unknown"}, "judge.model"),
        (
            {"type": "openai", "base_url": JUDGE_URL, "model": "m", "api_key": "mine"},
            "judge.openai.api_key",
        ),
        ({"type": "oracle"}, "judge"),
    ],
)
def test_judges_are_limited_to_what_the_operator_allows(
    client, team_a, instruction_file, eval_queue, judge, field
):
    r = _post(client, team_a, _instruction(instruction_file, judge=judge))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field
    assert eval_queue.ids == []


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"job_id": "job-x"}, "job_id"),  # both a job and a base model
        ({"base_model": None}, "job_id"),  # neither
        ({"step": 3}, "step"),
        ({"judge": None}, "judge"),
        ({"generation": {"n": 2}}, "generation.n"),
        ({"generation": {"temperature": 5}}, "generation.temperature"),
        ({"generation": {"max_new_tokens": 0}}, "generation.max_new_tokens"),
        ({"prompt_template": "Q: {problem}"}, "prompt_template"),
        ({"kind": "poetry"}, "kind"),
        ({"surprise": 1}, "surprise"),
        ({"file_id": None}, "file_id"),
        ({"base_model": "gpt-5"}, "base_model"),
        ({"base_model": "/etc"}, "base_model"),
    ],
)
def test_bad_requests_are_422_with_the_field(
    client, team_a, instruction_file, eval_queue, overrides, field
):
    r = _post(client, team_a, {**_instruction(instruction_file), **overrides})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field, r.json()
    assert eval_queue.ids == []


def test_math_specific_checks(client, team_a, math_file, eval_queue):
    judge = {"type": "openai", "base_url": JUDGE_URL, "model": "m"}
    assert _post(client, team_a, _math(math_file, judge=judge)).json()["error"]["field"] == "judge"
    r = _post(client, team_a, _math(math_file, prompt_template="no placeholder"))
    assert r.json()["error"]["field"] == "prompt_template"
    r = _post(
        client,
        team_a,
        _math(
            math_file,
            prompt_template="Solve: {problem}",
            system_prompt="Be brief.",
            max_items=5,
            generation={"n": 8},
        ),
    )
    assert r.status_code == 201, r.text
    cfg = r.json()["config"]
    assert (
        cfg["prompt_template"] == "Solve: {problem}"
        and cfg["max_items"] == 5
        and cfg["generation"]["n"] == 8
    )


def test_the_eval_file_must_be_the_teams_processed_eval_file_of_the_right_format(
    client, team_a, team_b, math_file, instruction_file, train_file, eval_queue
):
    cases = [
        (_math(train_file), 422, "purpose"),
        (_math(instruction_file), 422, "eval_math"),
        (_instruction(math_file), 422, "eval_instruction"),
        (_math("file-does-not-exist"), 404, "no file"),
    ]
    for body, status, text in cases:
        r = _post(client, team_a, body)
        assert (
            r.status_code == status and r.json()["error"]["field"] == "file_id" and text in r.text
        ), r.text
    other = upload(client, team_b, EVAL_MATH, purpose="eval").json()["id"]
    r = _post(client, team_a, _math(other))
    assert r.status_code == 404 and r.json()["error"]["field"] == "file_id"


def test_evaluating_a_job(client, team_a, team_b, math_file, eval_queue, db_sessions):
    done = _job(client, team_a, db_sessions, succeeded=True)
    r = _post(client, team_a, {"job_id": done, "file_id": math_file, "kind": "math"})
    assert r.status_code == 201, r.text
    assert (
        r.json()["job_id"] == done and r.json()["base_model"] is None and r.json()["step"] is None
    )

    running = _job(client, team_a, db_sessions, succeeded=False, checkpoint_step=5)
    r = _post(client, team_a, {"job_id": running, "file_id": math_file, "kind": "math"})
    assert r.status_code == 409 and r.json()["error"]["field"] == "job_id"  # no final model yet
    r = _post(client, team_a, {"job_id": running, "step": 5, "file_id": math_file, "kind": "math"})
    assert r.status_code == 201 and r.json()["step"] == 5
    with db_sessions() as s:
        assert s.get(Evaluation, r.json()["id"]).checkpoint_id is not None
    r = _post(client, team_a, {"job_id": running, "step": 6, "file_id": math_file, "kind": "math"})
    assert r.status_code == 404 and r.json()["error"]["field"] == "step"

    theirs = _job(client, team_b, db_sessions)
    r = _post(client, team_a, {"job_id": theirs, "file_id": math_file, "kind": "math"})
    assert r.status_code == 404 and r.json()["error"]["field"] == "job_id"


def test_idempotent_create(client, team_a, math_file, eval_queue, db_sessions):
    body = _math(math_file)
    first = _post(client, team_a, body, **{"Idempotency-Key": "k1"})
    again = _post(client, team_a, body, **{"Idempotency-Key": "k1"})
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again.headers.get("Idempotent-Replayed") == "true"
    assert eval_queue.ids == [first.json()["id"]]
    with db_sessions() as s:
        assert s.execute(select(func.count()).select_from(Evaluation)).scalar_one() == 1
    other = _post(client, team_a, _math(math_file, max_items=2), **{"Idempotency-Key": "k1"})
    assert other.status_code == 409


def test_active_evaluations_per_team_are_limited(client, team_a, math_file, eval_queue, settings):
    settings.MAX_EVALS_PER_TEAM = 2
    assert _post(client, team_a, _math(math_file)).status_code == 201
    assert _post(client, team_a, _math(math_file)).status_code == 201
    r = _post(client, team_a, _math(math_file))
    assert r.status_code == 429


def test_concurrent_creates_respect_the_evaluation_limit(
    client, team_a, math_file, eval_queue, settings, db_sessions
):
    """Issue 14 #7: the check was count-then-insert, so 30 concurrent creates made 12 under a
    limit of 10 (SQLite and PostgreSQL). Now insert, then count under the team's lock. The
    issue's figure: 50 concurrent creates at a limit of 10 make exactly 10."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from sqlalchemy import func, select

    from models.tables import Evaluation

    settings.MAX_EVALS_PER_TEAM = 10
    n = 50
    barrier = threading.Barrier(n)

    def create(_):
        barrier.wait()
        return _post(client, team_a, _math(math_file)).status_code

    with ThreadPoolExecutor(n) as pool:
        codes = list(pool.map(create, range(n)))
    assert codes.count(201) == 10 and set(codes) == {201, 429}, codes
    with db_sessions() as s:
        assert s.execute(select(func.count()).select_from(Evaluation)).scalar_one() == 10


def test_a_job_naming_more_evaluations_than_the_limit_is_refused(
    client, team_a, math_file, settings
):
    settings.MAX_EVALS_PER_TEAM = 1
    train = upload(client, team_a).json()["id"]
    evals = [{"file_id": math_file, "kind": "math"}] * 2
    r = client.post("/v1/jobs", headers=team_a.headers, json=job_body(train, evaluations=evals))
    assert r.status_code == 422 and r.json()["error"]["field"] == "evaluations"


def test_enqueue_failure_does_not_fail_the_request(client, team_a, math_file, eval_queue):
    eval_queue.fail = True
    r = _post(client, team_a, _math(math_file))
    assert r.status_code == 201 and r.json()["status"] == "queued"


# --- read ----------------------------------------------------------------------------------------


def test_list_filters_and_paginates(
    client, team_a, team_b, math_file, instruction_file, eval_queue, db_sessions
):
    ids = [_post(client, team_a, _math(math_file)).json()["id"] for _ in range(3)]
    inst = _post(client, team_a, _instruction(instruction_file)).json()["id"]
    with db_sessions() as s:
        s.execute(update(Evaluation).where(Evaluation.id == ids[0]).values(status="succeeded"))
        s.commit()

    def get(**q):
        return client.get("/v1/evaluations", headers=team_a.headers, params=q).json()

    assert [e["id"] for e in get()["data"]] == [inst, *reversed(ids)]
    assert [e["id"] for e in get(kind="instruction")["data"]] == [inst]
    assert [e["id"] for e in get(status="succeeded")["data"]] == [ids[0]]
    page = get(limit=2)
    assert page["has_more"] and len(page["data"]) == 2
    rest = get(limit=2, after=page["last_id"])
    assert [e["id"] for e in rest["data"]] == [ids[1], ids[0]] and not rest["has_more"]
    assert client.get("/v1/evaluations", headers=team_b.headers).json()["data"] == []
    assert (
        client.get(
            "/v1/evaluations", headers=team_a.headers, params={"status": "bogus"}
        ).status_code
        == 422
    )


def test_teams_cannot_see_each_others_evaluations(client, team_a, team_b, math_file, eval_queue):
    eid = _post(client, team_a, _math(math_file)).json()["id"]
    for path in (f"/v1/evaluations/{eid}", f"/v1/evaluations/{eid}/report"):
        r = client.get(path, headers=team_b.headers)
        assert r.status_code == 404 and r.json()["error"]["field"] == "evaluation_id"
    assert client.get(f"/v1/evaluations/{eid}").status_code == 401


def test_the_stored_report_once_succeeded(
    client, team_a, math_file, eval_queue, db_sessions, store
):
    eid = _post(client, team_a, _math(math_file)).json()["id"]
    r = client.get(f"/v1/evaluations/{eid}/report", headers=team_a.headers)
    assert r.status_code == 409  # not yet
    keys = {
        "json": report_key(team_a.id, eid, f"{eid}.json"),
        "html": report_key(team_a.id, eid, f"{eid}.html"),
    }
    store.put_bytes(keys["json"], json.dumps({"items": [1, 2]}).encode())
    store.put_bytes(keys["html"], b"<!DOCTYPE html><html><body>report</body></html>")
    with db_sessions() as s:
        s.execute(
            update(Evaluation)
            .where(Evaluation.id == eid)
            .values(
                status="succeeded",
                result={"metrics": {"pass_at_1": {"value": 0.5}}, "report": keys},
            )
        )
        s.commit()
    ev = client.get(f"/v1/evaluations/{eid}", headers=team_a.headers).json()
    assert ev["result"] == {"metrics": {"pass_at_1": {"value": 0.5}}}  # object keys stay internal
    r = client.get(f"/v1/evaluations/{eid}/report", headers=team_a.headers)
    assert r.status_code == 200 and r.json() == {"items": [1, 2]}
    r = client.get(
        f"/v1/evaluations/{eid}/report", headers=team_a.headers, params={"format": "html"}
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert r.text.endswith("report</body></html>")
    store.delete(keys["json"])
    assert client.get(f"/v1/evaluations/{eid}/report", headers=team_a.headers).status_code == 404
    bad = client.get(
        f"/v1/evaluations/{eid}/report", headers=team_a.headers, params={"format": "pdf"}
    )
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "format"
