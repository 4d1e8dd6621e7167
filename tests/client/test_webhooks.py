"""`client.webhooks`, `humanline webhooks` and `verify_webhook` against the real server."""

from __future__ import annotations

import json
import time

import pytest

from humanline_client import BadRequestError, WebhookVerificationError, verify_webhook
from worker.webhooks import signed_headers

PUBLIC = "https://93.184.215.14/hook"  # a public address: passes the SSRF guard, no DNS


def test_sdk_create_list_delete(client):
    hook = client.webhooks.create(url=PUBLIC, events=["job.succeeded"], description="ci")
    assert hook.secret and hook.secret.startswith("whsec_")
    assert hook.events == ["job.succeeded"] and hook.status == "enabled"
    again = client.webhooks.retrieve(hook.id)
    assert again.secret is None and again.description == "ci"
    assert [h.id for h in client.webhooks.list()] == [hook.id]
    assert list(client.webhooks.deliveries(hook.id)) == []
    assert client.webhooks.delete(hook.id).deleted
    assert list(client.webhooks.list()) == []


def test_sdk_refusal_names_the_url(client):
    with pytest.raises(BadRequestError) as caught:
        client.webhooks.create(url="http://169.254.169.254/latest")
    assert caught.value.field == "url" and "169.254.169.254" in str(caught.value)


def test_cli_webhooks(cli):
    created = cli("webhooks", "create", PUBLIC, "-e", "job.failed", "-e", "evaluation.failed")
    webhook_id = created.stdout.split()[0]
    assert webhook_id.startswith("wh-") and "secret: whsec_" in created.stdout
    listed = json.loads(cli("webhooks", "list", "--json").stdout)
    assert [(h["id"], h["events"], h["secret"]) for h in listed] == [
        (webhook_id, ["job.failed", "evaluation.failed"], None)
    ]
    assert webhook_id in cli("webhooks", "list").stdout
    assert "secret" not in cli("webhooks", "show", webhook_id).stdout
    assert json.loads(cli("webhooks", "deliveries", webhook_id, "--json").stdout) == []
    assert "deleted" in cli("webhooks", "delete", webhook_id).stdout
    refused = cli("webhooks", "create", "http://10.0.0.1/x", ok=False)
    assert refused.exit_code == 1 and "url" in refused.stderr


def test_verify_webhook_checks_what_the_server_signs():
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"type":"job.succeeded","data":{"id":"job-1"}}'
    headers = signed_headers(secret, "msg-1", body)
    assert verify_webhook(secret, headers, body)["data"] == {"id": "job-1"}
    with pytest.raises(WebhookVerificationError, match="signature"):
        verify_webhook(secret, headers, body.replace(b"job-1", b"job-2"))
    with pytest.raises(WebhookVerificationError, match="signature"):
        verify_webhook("whsec_" + "A" * 32, headers, body)
    with pytest.raises(WebhookVerificationError, match="signature"):
        verify_webhook(secret, {**headers, "webhook-id": "msg-2"}, body)
    stale = signed_headers(secret, "msg-1", body, timestamp=int(time.time()) - 3600)
    with pytest.raises(WebhookVerificationError, match="tolerance"):
        verify_webhook(secret, stale, body)
    with pytest.raises(WebhookVerificationError, match="missing"):
        verify_webhook(secret, {}, body)
