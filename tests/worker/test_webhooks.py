"""Webhook delivery (worker.webhooks) against a receiver on 127.0.0.1, on PostgreSQL: the
outbox rows written with a job's or an evaluation's end, Standard Webhooks signatures,
retries after 500s and timeouts, ids, ordering, SSRF at delivery, deleted endpoints and
revoked teams, disabling. The embedded (SQLite) path: test_embedded_webhooks at the end."""

from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace

import httpx
import pytest
from sqlalchemy import select

from models import evaluations as eval_states
from models import jobs as job_states
from models import webhooks
from models.base import utcnow
from models.db import make_engine, make_session_factory
from models.settings import Settings
from models.tables import ApiKey
from models.teams import create_api_key, create_team, revoke_api_key
from models.webhooks import WebhookAttempt, WebhookDelivery, WebhookEndpoint, new_secret
from tests.fixtures.rows import add_evaluation
from tests.worker.webhook_receiver import Receiver, tls_context_for, verify
from worker import embedded
from worker.webhooks import deliver_endpoint, due_endpoints, sign

SPEC = {"base_model": "tiny-llama", "objective": {"name": "dpo"}}


@pytest.fixture
def db_backend() -> str:
    return "postgresql"  # the embedded test makes its own SQLite database


@pytest.fixture(autouse=True)
def _no_sender():
    previous = webhooks.set_sender(None)  # the tests drive deliveries themselves
    yield
    webhooks.set_sender(previous)


def settings_for(db_url: str, **overrides) -> Settings:
    values = {
        "DATABASE_URL": db_url, "BROKER_URL": "redis://unused", "WEBHOOKS_ALLOW_HTTP": True,
        "WEBHOOKS_ALLOWED_CIDRS": "127.0.0.1/32", "WEBHOOK_TIMEOUT_SECONDS": 0.3,
        "WEBHOOK_BACKOFF_SECONDS": 0.05, "WEBHOOK_MAX_ATTEMPTS": 4, "WEBHOOK_DISABLE_AFTER": 3,
        **overrides,
    }  # fmt: skip
    return Settings(**values)


def make_team(sessions) -> str:
    with sessions() as s:
        team = create_team(s, f"t-{time.monotonic_ns()}")
        create_api_key(s, team.id)
        s.commit()
        return team.id


def make_endpoint(sessions, team_id: str, url: str, events=webhooks.WEBHOOK_EVENTS) -> tuple:
    with sessions() as s:
        row = WebhookEndpoint(
            team_id=team_id, url=url, events=list(events), secret=new_secret(),
            status="enabled", consecutive_failures=0,
        )  # fmt: skip
        s.add(row)
        s.commit()
        return row.id, row.secret


def end_job(sessions, team_id: str, status: str = "succeeded", *, commit: bool = True) -> str:
    with sessions() as s:
        job_id = job_states.create_job(s, team_id=team_id, spec=SPEC).id
        s.commit()
        assert job_states.claim(s, job_id, "w1", 60) is not None
        s.commit()
        if status == "cancelled":
            assert job_states.transition(s, job_id, "running", "cancelling")
        error = {"message": "boom", "type": "trainer_error"} if status == "failed" else None
        assert job_states.finish(s, job_id, "w1", status, error=error)
        s.commit() if commit else s.rollback()
        return job_id


def end_evaluation(sessions, job_id: str, status: str = "succeeded") -> str:
    evaluation_id = add_evaluation(sessions, job_id, 0.5, status="queued")
    with sessions() as s:
        assert eval_states.claim(s, evaluation_id, "w1", 60) is not None
        assert eval_states.finish(s, evaluation_id, "w1", status)
        s.commit()
    return evaluation_id


def drive(sessions, settings, endpoint_id: str, rounds: int = 20) -> None:
    """What the Celery task does with its countdowns: deliver, wait the delay, again."""
    for _ in range(rounds):
        delay = deliver_endpoint(sessions, settings, endpoint_id)
        if delay is None:
            return
        time.sleep(delay)
    raise AssertionError("deliveries still pending")


def deliveries(sessions, endpoint_id: str) -> list[WebhookDelivery]:
    with sessions() as s:
        query = select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint_id)
        return list(s.scalars(query.order_by(WebhookDelivery.seq)))


def attempts(sessions, delivery: WebhookDelivery) -> list[WebhookAttempt]:
    with sessions() as s:
        query = select(WebhookAttempt).where(WebhookAttempt.delivery_seq == delivery.seq)
        return list(s.scalars(query.order_by(WebhookAttempt.id)))


def test_signature_matches_the_spec_example():
    # The example of the Standard Webhooks spec and its reference libraries.
    signature = sign(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1614265330, b'{"test": 2432232314}',
    )  # fmt: skip
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_a_finished_job_is_delivered_signed(db_sessions, db_url):
    settings = settings_for(db_url)
    team = make_team(db_sessions)
    with Receiver() as rx:
        endpoint, secret = make_endpoint(db_sessions, team, rx.url)
        job_id = end_job(db_sessions, team, "failed")
        drive(db_sessions, settings, endpoint)
        [got] = rx.received
    body = verify(secret, got)
    assert body["type"] == "job.failed"
    assert body["data"] == {
        "id": job_id, "object": "job", "status": "failed",
        "error": {"message": "boom", "type": "trainer_error"},
    }  # fmt: skip
    [delivery] = deliveries(db_sessions, endpoint)
    assert got.headers["webhook-id"] == delivery.id and delivery.status == "delivered"
    assert [a.status_code for a in attempts(db_sessions, delivery)] == [200]
    with pytest.raises(AssertionError):  # the verifier does reject another secret
        verify(new_secret(), got)


def test_retries_after_500_and_a_timeout_keep_the_id(db_sessions, db_url):
    settings = settings_for(db_url)
    team = make_team(db_sessions)
    with Receiver(script=[500, "slow"], slow=1.0) as rx:
        endpoint, secret = make_endpoint(db_sessions, team, rx.url)
        end_job(db_sessions, team)
        started = time.monotonic()
        drive(db_sessions, settings, endpoint)
        elapsed = time.monotonic() - started
        time.sleep(0.05)
        got = list(rx.received)
    assert len(got) == 3
    assert len({r.headers["webhook-id"] for r in got}) == 1  # one event, one id
    for r in got:
        verify(secret, r)
    [delivery] = deliveries(db_sessions, endpoint)
    log = attempts(db_sessions, delivery)
    assert [a.status_code for a in log] == [500, None, 200]
    assert "timed out" in (log[1].error or "")
    assert delivery.status == "delivered" and delivery.attempts == 3
    assert elapsed >= 0.05 + 0.1 + 0.3  # backoff 0.05 then 0.1, and the 0.3 s timeout


def test_events_are_ordered_and_each_has_its_own_id(db_sessions, db_url):
    settings = settings_for(db_url)
    team = make_team(db_sessions)
    with Receiver(script=[500]) as rx:
        endpoint, _ = make_endpoint(db_sessions, team, rx.url)
        job_a = end_job(db_sessions, team)
        evaluation = end_evaluation(db_sessions, job_a, "failed")
        job_b = end_job(db_sessions, team, "cancelled")
        drive(db_sessions, settings, endpoint)
        got = list(rx.received)
    seen = [(r.json["type"], r.json["data"]["id"]) for r in got]
    # The first attempt failed: the later events waited for its retry.
    assert seen == [
        ("job.succeeded", job_a), ("job.succeeded", job_a),
        ("evaluation.failed", evaluation), ("job.cancelled", job_b),
    ]  # fmt: skip
    ids = [r.headers["webhook-id"] for r in got]
    assert ids[0] == ids[1] and len(set(ids)) == 3


def test_subscriptions_and_rollbacks(db_sessions, db_url):
    settings = settings_for(db_url)
    team, other = make_team(db_sessions), make_team(db_sessions)
    with Receiver() as rx:
        endpoint, _ = make_endpoint(db_sessions, team, rx.url, events=["job.failed"])
        end_job(db_sessions, team, "succeeded")  # not subscribed
        end_job(db_sessions, other, "failed")  # another team's
        end_job(db_sessions, team, "failed", commit=False)  # rolled back: no event
        assert deliveries(db_sessions, endpoint) == []
        job_id = end_job(db_sessions, team, "failed")
        drive(db_sessions, settings, endpoint)
        assert [r.json["data"]["id"] for r in rx.received] == [job_id]


def test_the_commit_wakes_the_sender(db_sessions, db_url):
    team = make_team(db_sessions)
    endpoint, _ = make_endpoint(db_sessions, team, "http://127.0.0.1:9/x")
    woken: list[tuple[str, int]] = []

    def send(endpoint_id: str) -> None:  # runs after the commit: the row is visible
        woken.append((endpoint_id, len(deliveries(db_sessions, endpoint_id))))

    webhooks.set_sender(send)
    end_job(db_sessions, team, "failed", commit=False)
    assert woken == []
    end_job(db_sessions, team, "failed")
    assert woken == [(endpoint, 1)]


def test_the_celery_task_sends_itself_again_when_a_retry_is_due(db_sessions, db_url, monkeypatch):
    from worker import tasks

    monkeypatch.setattr(tasks, "runner", lambda: SimpleNamespace(sessions=db_sessions))
    monkeypatch.setattr(tasks, "settings", settings_for(db_url))
    sent: list[tuple[str, float | None]] = []
    monkeypatch.setattr(tasks, "send_deliver_webhooks", lambda e, countdown=None: sent.append(
        (e, countdown)
    ))  # fmt: skip
    team = make_team(db_sessions)
    with Receiver(script=[500]) as rx:
        endpoint, _ = make_endpoint(db_sessions, team, rx.url)
        end_job(db_sessions, team)
        delay = tasks.deliver_webhooks(endpoint)
        assert delay is not None and 0 < delay <= 0.05 and sent == [(endpoint, delay)]
        time.sleep(delay)
        assert tasks.deliver_webhooks(endpoint) is None and len(sent) == 1
        assert len(rx.received) == 2


def test_the_sweep_finds_what_no_sender_took(db_sessions, db_url):
    settings = settings_for(db_url)
    team = make_team(db_sessions)
    with Receiver() as rx:
        endpoint, _ = make_endpoint(db_sessions, team, rx.url)
        end_job(db_sessions, team)  # no sender: as if the broker message was lost
        assert due_endpoints(db_sessions) == [endpoint]
        with db_sessions() as s:  # a live sender holds it: not sent twice
            s.get(WebhookEndpoint, endpoint).lease_until = utcnow() + timedelta(seconds=60)
            s.commit()
        assert due_endpoints(db_sessions) == []
        assert deliver_endpoint(db_sessions, settings, endpoint) is None and not rx.received
        with db_sessions() as s:  # its worker died: the lease runs out
            s.get(WebhookEndpoint, endpoint).lease_until = utcnow() - timedelta(seconds=1)
            s.commit()
        for endpoint_id in due_endpoints(db_sessions):
            drive(db_sessions, settings, endpoint_id)
        assert len(rx.received) == 1
    assert due_endpoints(db_sessions) == []


def test_https_goes_to_the_checked_address_with_the_name_for_tls(db_sessions, db_url, tmp_path):
    """The connection is pinned to the resolved address while TLS (SNI, the certificate's
    name) and Host still use the URL's name; a certificate for another name fails."""
    settings = settings_for(db_url, WEBHOOKS_ALLOW_HTTP=False, WEBHOOK_MAX_ATTEMPTS=1)
    team = make_team(db_sessions)
    server_tls, client_tls = tls_context_for(tmp_path, "hooks.test")
    resolver = lambda host, port: ["127.0.0.1"] if host == "hooks.test" else []  # noqa: E731
    with Receiver(tls=server_tls) as rx, httpx.Client(verify=client_tls) as http:
        good, secret = make_endpoint(db_sessions, team, f"https://hooks.test:{rx.port}/h")
        end_job(db_sessions, team)
        deliver_endpoint(db_sessions, settings, good, client=http, resolver=resolver)
        [got] = rx.received
        verify(secret, got)
        assert got.headers["host"] == f"hooks.test:{rx.port}"
        with db_sessions() as s:
            s.delete(s.get(WebhookEndpoint, good))
            s.commit()
        other, _ = make_endpoint(db_sessions, team, f"https://other.test:{rx.port}/h")
        end_job(db_sessions, team)
        deliver_endpoint(
            db_sessions, settings, other, client=http, resolver=lambda h, p: ["127.0.0.1"]
        )
        assert len(rx.received) == 1
    [failed] = deliveries(db_sessions, other)
    assert failed.status == "failed" and "CERTIFICATE_VERIFY_FAILED" in (failed.last_error or "")


def test_private_addresses_are_refused_at_delivery(db_sessions, db_url):
    team = make_team(db_sessions)
    with Receiver() as rx:
        endpoint, _ = make_endpoint(db_sessions, team, rx.url)
        end_job(db_sessions, team)
        strict = settings_for(
            db_url, WEBHOOKS_ALLOWED_CIDRS="", WEBHOOK_MAX_ATTEMPTS=1
        )  # e.g. the operator narrowed the allow-list after the endpoint was created
        drive(db_sessions, strict, endpoint)
        assert rx.received == []
    [delivery] = deliveries(db_sessions, endpoint)
    assert delivery.status == "failed"
    error = delivery.last_error or ""
    assert "127.0.0.1" in error and "refused" in error


def test_dns_rebinding_is_checked_at_delivery(db_sessions, db_url):
    settings = settings_for(db_url, WEBHOOKS_ALLOWED_CIDRS="", WEBHOOK_MAX_ATTEMPTS=1)
    team = make_team(db_sessions)
    with Receiver() as rx:
        endpoint, _ = make_endpoint(db_sessions, team, "http://rebind.example:8080/hook")
        end_job(db_sessions, team)
        # The name resolved to a public address when the endpoint was made; now to loopback.
        delay = deliver_endpoint(
            db_sessions, settings, endpoint, resolver=lambda host, port: ["127.0.0.1"]
        )
        assert delay is None and rx.received == []
    [delivery] = deliveries(db_sessions, endpoint)
    assert "resolves to 127.0.0.1" in (delivery.last_error or "")


def test_no_delivery_outlives_a_deleted_endpoint_or_a_revoked_team(db_sessions, db_url):
    settings = settings_for(db_url)
    team = make_team(db_sessions)
    with Receiver() as rx:
        gone, _ = make_endpoint(db_sessions, team, rx.url)
        kept, _ = make_endpoint(db_sessions, team, rx.url)
        end_job(db_sessions, team)
        with db_sessions() as s:
            s.delete(s.get(WebhookEndpoint, gone))
            s.commit()
        assert deliver_endpoint(db_sessions, settings, gone) is None
        assert rx.received == []
        with db_sessions() as s:
            for key in s.scalars(select(ApiKey).where(ApiKey.team_id == team)):
                revoke_api_key(s, key.id)
            s.commit()
        drive(db_sessions, settings, kept)
        assert rx.received == []
    [delivery] = deliveries(db_sessions, kept)
    assert delivery.status == "cancelled" and "revoked" in (delivery.last_error or "")


def test_repeated_failures_disable_the_endpoint(db_sessions, db_url):
    settings = settings_for(db_url, WEBHOOK_MAX_ATTEMPTS=2, WEBHOOK_DISABLE_AFTER=2)
    team = make_team(db_sessions)
    with Receiver(default=500) as rx:
        endpoint, _ = make_endpoint(db_sessions, team, rx.url)
        for _ in range(3):
            end_job(db_sessions, team, "failed")
        drive(db_sessions, settings, endpoint)
        assert len(rx.received) == 4  # two deliveries × two attempts; the third never sent
        end_job(db_sessions, team, "failed")  # a disabled endpoint gets no new deliveries
    assert [d.status for d in deliveries(db_sessions, endpoint)] == [
        "failed", "failed", "cancelled"
    ]
    with db_sessions() as s:
        row = s.get(WebhookEndpoint, endpoint)
        assert row.status == "disabled" and row.disabled_at is not None
        assert "2 failed deliveries in a row" in (row.disabled_reason or "")


def test_embedded_webhooks(sqlite_url, tmp_path):
    """The embedded default (SQLite, the in-process worker): its webhook thread delivers
    what a commit queued, retries included, without any broker."""
    settings = settings_for(
        sqlite_url, BROKER_URL="memory://", WEBHOOKS_ALLOW_HTTP=None, SWEEP_SECONDS=0,
        STORAGE_URL=f"file://{tmp_path / 'objects'}",
    )  # fmt: skip
    engine = make_engine(sqlite_url)
    db_sessions = make_session_factory(engine)
    team = make_team(db_sessions)
    worker = embedded.start(settings)
    try:
        with Receiver(script=[500]) as rx:
            endpoint, secret = make_endpoint(db_sessions, team, rx.url)
            job_id = end_job(db_sessions, team)
            deadline = time.monotonic() + 5
            while len(rx.received) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert [verify(secret, r)["data"]["id"] for r in rx.received] == [job_id] * 2
        assert [d.status for d in deliveries(db_sessions, endpoint)] == ["delivered"]
    finally:
        embedded.stop()
        engine.dispose()
    assert not worker.webhooks.is_alive()
