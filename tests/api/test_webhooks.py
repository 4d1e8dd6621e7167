"""/v1/webhooks: create (secret shown once), list, get, delete, the delivery log, and the
SSRF guard at create (models.webhook_urls)."""

from __future__ import annotations

import httpx
import pytest

from api.main import create_app
from models import webhooks
from models.settings import Settings
from models.webhook_urls import UrlRefused, check_url
from models.webhooks import new_secret
from tests.api.conftest import claim_job, create_job, finish_job
from tests.worker.webhook_receiver import Receiver
from worker.webhooks import deliver_endpoint, send_once


@pytest.fixture
def db_backend() -> str:
    return "postgresql"


@pytest.fixture(autouse=True)
def _no_sender():
    previous = webhooks.set_sender(None)
    yield
    webhooks.set_sender(previous)


@pytest.fixture
def settings(settings) -> Settings:
    return settings.model_copy(update={"WEBHOOKS_ALLOWED_CIDRS": "127.0.0.1/32"})


def test_create_shows_the_secret_once(client, team_a, team_b):
    r = client.post(
        "/v1/webhooks", headers=team_a.headers,
        json={"url": "http://127.0.0.1:8/hook", "events": ["job.failed", "job.failed"]},
    )  # fmt: skip
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["secret"].startswith("whsec_") and len(created["secret"]) > 30
    assert created["events"] == ["job.failed"] and created["status"] == "enabled"
    webhook_id = created["id"]
    got = client.get(f"/v1/webhooks/{webhook_id}", headers=team_a.headers).json()
    listed = client.get("/v1/webhooks", headers=team_a.headers).json()["data"]
    assert got["secret"] is None and [w["secret"] for w in listed] == [None]
    assert client.get(f"/v1/webhooks/{webhook_id}", headers=team_b.headers).status_code == 404
    assert client.get("/v1/webhooks", headers=team_b.headers).json()["data"] == []
    assert client.delete(f"/v1/webhooks/{webhook_id}", headers=team_b.headers).status_code == 404
    r = client.delete(f"/v1/webhooks/{webhook_id}", headers=team_a.headers)
    assert r.json() == {"id": webhook_id, "object": "webhook_endpoint", "deleted": True}
    assert client.get(f"/v1/webhooks/{webhook_id}", headers=team_a.headers).status_code == 404


def test_a_retried_create_returns_the_same_endpoint(client, team_a):
    headers = {**team_a.headers, "Idempotency-Key": "k1"}
    body = {"url": "http://127.0.0.1:8/hook"}
    first = client.post("/v1/webhooks", headers=headers, json=body)
    again = client.post("/v1/webhooks", headers=headers, json=body)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
    assert len(client.get("/v1/webhooks", headers=team_a.headers).json()["data"]) == 1


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.2/x",  # loopback outside the allowed /32
        "http://[fe80::1]/x",
        "http://169.254.169.254/latest/meta-data",  # link-local (cloud metadata)
        "http://10.0.0.1/x",
        "http://192.168.1.1/x",
        "http://[::1]/x",
        "http://[::ffff:10.0.0.1]/x",  # an IPv4-mapped private address
        "http://0.0.0.0/x",
        "ftp://example.com/x",
        "http://user:pw@127.0.0.1/x",
    ],
)
def test_refused_urls_name_the_field(client, team_a, url):
    r = client.post("/v1/webhooks", headers=team_a.headers, json={"url": url})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == "url"


EMBEDS_IPV4 = [
    "64:ff9b::169.254.169.254",  # NAT64 (well-known prefix) to cloud metadata
    "64:ff9b::10.0.0.1",  # NAT64 to a private address
    "64:ff9b:1::a9fe:a9fe",  # the local-use NAT64 prefix 64:ff9b:1::/48
    "64:ff9b:1:2:3::808:808",  # ... whatever it embeds
    "2002:a9fe:a9fe::1",  # 6to4 around 169.254.169.254
    "2002:7f00:1::1",  # 6to4 around 127.0.0.1
    "::127.0.0.1",  # IPv4-compatible
    "::8.8.8.8",  # IPv4-compatible, deprecated whatever it embeds
    "::ffff:0:10.0.0.1",  # SIIT (IPv4-translated)
    "::ffff:0:8.8.8.8",
    "::ffff:169.254.169.254",  # IPv4-mapped metadata
    "fec0::1",  # site-local
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
]


@pytest.mark.parametrize("address", EMBEDS_IPV4)
def test_ipv6_forms_embedding_ipv4_are_refused(client, team_a, settings, address):
    """Literal or behind a name, at create (the API) and at each delivery (the worker)."""
    r = client.post("/v1/webhooks", headers=team_a.headers, json={"url": f"http://[{address}]/x"})
    assert r.status_code == 400 and r.json()["error"]["field"] == "url", r.text
    with pytest.raises(UrlRefused, match="resolves to"):
        check_url("http://hooks.example/x", settings, resolver=lambda h, p: [address])
    code, error = send_once(
        "http://hooks.example/x", new_secret(), "msg_1", {}, settings,
        client=httpx.Client(), resolver=lambda h, p: ["127.0.0.1", address],
    )  # fmt: skip
    assert code is None and error is not None and "refused at delivery" in error


@pytest.mark.parametrize("address", ["64:ff9b::8.8.8.8", "2002:808:808::1", "2606:4700::1"])
def test_public_targets_behind_nat64_and_6to4_pass(settings, address):
    """DNS64 answers 64:ff9b::a.b.c.d for every IPv4-only receiver: its IPv4 is what counts."""
    assert check_url("https://hooks.example/x", settings, resolver=lambda h, p: [address])


def test_bad_events_are_a_422(client, team_a):
    r = client.post(
        "/v1/webhooks", headers=team_a.headers,
        json={"url": "http://127.0.0.1/x", "events": ["job.started"]},
    )  # fmt: skip
    assert r.status_code == 422 and "events" in r.text


def test_operator_settings(settings):
    public = lambda host, port: ["93.184.215.14"]  # noqa: E731 - a resolver stub
    production = settings.model_copy(update={"BROKER_URL": "redis://x"})
    with pytest.raises(UrlRefused, match="https"):
        check_url("http://hooks.example.com/x", production, resolver=public)
    assert check_url("https://hooks.example.com/x", production, resolver=public).port == 443
    with pytest.raises(UrlRefused, match="10.1.2.3"):
        check_url("https://a.example/x", production, resolver=lambda h, p: ["10.1.2.3"])
    with pytest.raises(UrlRefused, match="resolves to"):  # no allow-list
        check_url("http://localhost/x", settings.model_copy(update={"WEBHOOKS_ALLOWED_CIDRS": ""}))
    allowed = production.model_copy(update={"WEBHOOKS_ALLOW_PRIVATE": True})
    assert check_url("https://a.example/x", allowed, resolver=lambda h, p: ["10.1.2.3"])


def test_delivery_log(client, team_a, db_sessions, settings, train_file):
    with Receiver(script=[503]) as rx:
        r = client.post("/v1/webhooks", headers=team_a.headers, json={"url": rx.url})
        webhook_id = r.json()["id"]
        job_id = create_job(client, team_a, train_file)["id"]
        claim_job(db_sessions, job_id)
        finish_job(db_sessions, job_id, "succeeded")
        fast = settings.model_copy(update={"WEBHOOK_BACKOFF_SECONDS": 0.0})
        assert deliver_endpoint(db_sessions, fast, webhook_id) is None
    page = client.get(f"/v1/webhooks/{webhook_id}/deliveries", headers=team_a.headers).json()
    [delivery] = page["data"]
    assert delivery["event"] == "job.succeeded" and delivery["status"] == "delivered"
    assert delivery["payload"]["data"]["id"] == job_id
    assert [a["status_code"] for a in delivery["log"]] == [503, 200]
    assert delivery["id"] == rx.received[0].headers["webhook-id"]


def test_api_sender_is_installed_only_for_a_broker(settings, store, db_sessions):
    previous = webhooks.set_sender(None)
    create_app(settings, store=store, session_factory=db_sessions)  # embedded: the worker's
    assert webhooks.set_sender(None) is None
    broker = settings.model_copy(update={"BROKER_URL": "redis://127.0.0.1:1/0"})
    create_app(broker, store=store, session_factory=db_sessions)  # sends the Celery task
    sender = webhooks.set_sender(previous)
    assert sender is not None
    assert getattr(sender, "__self__").inner.task == "worker.tasks.deliver_webhooks"  # noqa: B009
