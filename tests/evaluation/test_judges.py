"""Judges: the OpenAI-compatible judge against a real local server and against a scripted
server that times out, rate-limits and fails; the reward-model judge."""

from __future__ import annotations

import time

import httpx
import pytest

from trainer.evaluation.judges import (
    JudgeError,
    Judgement,
    OpenAIJudge,
    Pair,
    RewardModelJudge,
    parse_retry_after,
    parse_verdict,
)

PAIR = Pair("Name a colour.", "Blue.", "I like turtles.")


@pytest.mark.parametrize(
    "text,verdict",
    [
        ("A", "A"),
        (" B\n", "B"),
        ("Answer B is better.", "B"),
        ("T", "tie"),
        ("tie", "tie"),
        ("A is better than B", "A"),
        ("a nice reply", None),
        ("", None),
        ("**B**", "B"),
    ],
)
def test_parse_verdict(text, verdict):
    assert parse_verdict(text) == verdict


def test_judgement_scores():
    assert Judgement("A", "").score("A") == 1.0 and Judgement("A", "").score("B") == 0.0
    assert Judgement("tie", "").score("A") == 0.5 and Judgement(None, "?").score("B") == 0.5


def test_retry_after_parsing():
    assert parse_retry_after("2") == 2.0 and parse_retry_after("0.25") == 0.25
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    http_date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 < parse_retry_after(http_date) <= 31


# --- a real local server -------------------------------------------------------------------------


def test_judge_against_the_local_openai_server(local_openai_server):
    s = local_openai_server
    with OpenAIJudge(s.base_url, s.model, s.api_key, timeout=60, concurrency=2) as judge:
        verdicts = judge.judge([PAIR, Pair(PAIR.instruction, PAIR.b, PAIR.a)])
        assert len(verdicts) == 2
        for v in verdicts:  # tiny-llama is random: any verdict, but a real reply came back
            assert isinstance(v.raw, str) and v.verdict in ("A", "B", "tie", None)
        assert judge.stats["requests"] == 2 and judge.stats["retries"] == 0


def test_local_server_speaks_the_openai_chat_api(local_openai_server):
    s = local_openai_server
    headers = {"Authorization": f"Bearer {s.api_key}"}
    body = {
        "model": s.model,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 5,
        "n": 2,
        "temperature": 0.7,
        "seed": 1,
    }
    r = httpx.post(s.base_url + "/chat/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["object"] == "chat.completion" and len(doc["choices"]) == 2
    assert all(c["message"]["role"] == "assistant" for c in doc["choices"])
    assert doc["usage"]["completion_tokens"] <= 10 and doc["usage"]["prompt_tokens"] > 0
    assert httpx.get(s.base_url + "/models", headers=headers).json()["data"][0]["id"] == s.model
    # deterministic with a seed
    again = httpx.post(
        s.base_url + "/chat/completions", json=body, headers=headers, timeout=60
    ).json()
    assert [c["message"] for c in again["choices"]] == [c["message"] for c in doc["choices"]]
    assert httpx.post(s.base_url + "/chat/completions", json=body, timeout=10).status_code == 401
    wrong = httpx.post(
        s.base_url + "/chat/completions",
        json={**body, "model": "gpt-9"},
        headers=headers,
        timeout=10,
    )
    assert wrong.status_code == 404


def test_a_wrong_api_key_fails_at_once_without_retries(local_openai_server):
    s = local_openai_server
    with OpenAIJudge(s.base_url, s.model, "wrong-key", max_attempts=5) as judge:
        t0 = time.monotonic()
        with pytest.raises(JudgeError, match="HTTP 401"):
            judge.judge([PAIR])
        assert time.monotonic() - t0 < 5 and judge.stats["requests"] == 1


# --- a misbehaving server ------------------------------------------------------------------------


def test_429_twice_then_success_is_retried_honouring_retry_after(scripted_server):
    scripted_server.script = [("status", 429, 0.3), ("status", 429, 0.3), ("ok", "B")]
    with OpenAIJudge(scripted_server.base_url, "m", "key-1", backoff=0.01) as judge:
        [verdict] = judge.judge([PAIR])
    assert verdict.verdict == "B"
    t = scripted_server.times
    assert len(t) == 3 and judge.stats["retries"] == 2
    assert t[1] - t[0] >= 0.28 and t[2] - t[1] >= 0.28  # waited as told, not the 10 ms backoff
    assert scripted_server.requests[0]["authorization"] == "Bearer key-1"
    assert scripted_server.requests[0]["body"]["temperature"] == 0.0


def test_timeouts_twice_then_success(scripted_server):
    scripted_server.script = [("sleep", 2.0), ("sleep", 2.0), ("ok", "A")]
    with OpenAIJudge(scripted_server.base_url, "m", timeout=0.5, backoff=0.01) as judge:
        t0 = time.monotonic()
        [verdict] = judge.judge([PAIR])
    assert verdict.verdict == "A" and len(scripted_server.times) == 3
    assert time.monotonic() - t0 < 3


def test_5xx_is_retried(scripted_server):
    scripted_server.script = [("status", 503, None), ("status", 502, None), ("ok", "T")]
    with OpenAIJudge(scripted_server.base_url, "m", backoff=0.01) as judge:
        assert judge.judge([PAIR])[0].verdict == "tie"


def _seconds_to_fail(server, pairs: list[Pair], match: str | None, **options) -> float:
    """How long the judge (with these options) takes to raise JudgeError on `pairs`."""
    with OpenAIJudge(server.base_url, "m", **options) as judge:
        t0 = time.monotonic()
        with pytest.raises(JudgeError, match=match):
            judge.judge(pairs)
        return time.monotonic() - t0


def test_always_failing_raises_judge_error_quickly(scripted_server):
    scripted_server.script = [("status", 500, None)]
    attempts = {"max_attempts": 4, "backoff": 0.05, "concurrency": 4}
    match = r"failed after 4 attempt\(s\).*HTTP 500"
    assert _seconds_to_fail(scripted_server, [PAIR] * 8, match, **attempts) < 5


def test_the_deadline_bounds_a_hanging_server(scripted_server):
    # Every attempt hangs; many attempts allowed. The deadline (not the attempt count) ends it.
    scripted_server.script = [("sleep", 30.0)]
    limits = {"timeout": 0.6, "deadline": 1.5, "max_attempts": 100, "backoff": 0.01}
    elapsed = _seconds_to_fail(scripted_server, [PAIR], "timed out", **limits)
    assert 1.0 < elapsed < 3.0, elapsed


def test_a_server_dripping_bytes_cannot_hold_an_attempt_open(scripted_server):
    # Each byte arrives within the read timeout; only the per-attempt wall clock stops it.
    scripted_server.script = [("drip", 20.0)]
    limits = {"timeout": 1.0, "deadline": 2.0, "max_attempts": 2, "backoff": 0.01}
    assert _seconds_to_fail(scripted_server, [PAIR], None, **limits) < 5


def test_retry_after_beyond_the_deadline_gives_up_instead_of_sleeping(scripted_server):
    scripted_server.script = [("status", 429, 60)]
    with OpenAIJudge(scripted_server.base_url, "m", deadline=5.0, max_wait=120) as judge:
        t0 = time.monotonic()
        with pytest.raises(JudgeError, match="HTTP 429"):
            judge.judge([PAIR])
    assert time.monotonic() - t0 < 2 and len(scripted_server.times) == 1


def test_unreachable_endpoint_is_a_judge_error():
    with (
        OpenAIJudge("http://127.0.0.1:9/v1", "m", max_attempts=2, backoff=0.01, timeout=1) as judge,
        pytest.raises(JudgeError, match="connection error"),
    ):
        judge.judge([PAIR])


def test_malformed_reply_is_a_judge_error(scripted_server):
    scripted_server.script = [("garbage",)]
    judge = OpenAIJudge(scripted_server.base_url, "m")
    with pytest.raises(JudgeError, match="malformed"):
        judge.judge([PAIR])


def test_redirects_are_not_followed(scripted_server):
    # A 3xx would carry the Authorization header elsewhere; it is an error instead.
    scripted_server.script = [("status", 307, None)]
    judge = OpenAIJudge(scripted_server.base_url, "m", "secret")
    with pytest.raises(JudgeError, match="HTTP 307"):
        judge.judge([PAIR])


# --- a reward model ------------------------------------------------------------------------------


def test_reward_model_judge_prefers_the_higher_score_and_is_symmetric(reward_model_dir):
    judge = RewardModelJudge(reward_model_dir)
    answers = ["Blue.", "I like turtles.", "The colour of the sky on a clear day: blue.", "x"]
    scores = judge.score([(PAIR.instruction, a) for a in answers])
    assert len(set(scores)) == len(scores)  # a random model still tells them apart
    pairs = [Pair(PAIR.instruction, a, b) for a in answers for b in answers if a != b]
    for p, v in zip(pairs, judge.judge(pairs), strict=False):
        sa, sb = scores[answers.index(p.a)], scores[answers.index(p.b)]
        assert v.verdict == ("A" if sa > sb else "B")
    assert judge.judge([Pair("q", "same", "same")])[0].verdict == "tie"


def test_a_judge_run_without_the_services_settings_gets_the_same_limits():
    """`python -m trainer.evaluation` with a bare judge config, the judge class's defaults and
    the operator's EVAL_JUDGE_* defaults are one set of limits (contract.evaluation)."""
    from models.settings import Settings
    from trainer.evaluation.run import make_judge

    judge = make_judge({"type": "openai", "base_url": "http://j/v1", "model": "m"}, None)
    plain = OpenAIJudge("http://j/v1", "m")
    settings = Settings()
    for made in (judge, plain):
        assert (made.timeout, made.deadline, made.max_attempts, made.concurrency) == (
            settings.EVAL_JUDGE_TIMEOUT_SECONDS,
            settings.EVAL_JUDGE_DEADLINE_SECONDS,
            settings.EVAL_JUDGE_MAX_ATTEMPTS,
            settings.EVAL_JUDGE_CONCURRENCY,
        )
