"""The API on a real S3 store (SeaweedFS): uploads land atomically, bad ones leave no object,
checkpoint downloads redirect to presigned URLs that work."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from models import jobs as job_states
from storage.keys import checkpoint_prefix
from tests.api.conftest import PREFERENCE, job_body, presigned_checkpoint_file, upload

pytestmark = pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)


@pytest.fixture
def s3_client(settings, s3_store, queue, db_sessions) -> TestClient:
    return TestClient(
        create_app(settings, store=s3_store, queue=queue, session_factory=db_sessions)
    )


def test_uploads_and_checkpoint_downloads_on_s3(s3_client, s3_store, team_a, db_sessions, tmp_path):
    client = s3_client
    assert upload(client, team_a, b'{"prompt": "p"}\n{oops').status_code == 422
    assert s3_store.list("") == []
    file_id = upload(client, team_a).json()["id"]
    assert s3_store.list("") == [f"{team_a.id}/files/{file_id}.jsonl"]
    content = client.get(f"/v1/files/{file_id}/content", headers=team_a.headers)
    assert content.content == PREFERENCE

    job_id = client.post("/v1/jobs", headers=team_a.headers, json=job_body(file_id)).json()["id"]
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"weights" * 1000)
    prefix = checkpoint_prefix(team_a.id, job_id, 2)
    s3_store.upload_dir(prefix, tmp_path / "ckpt")
    with db_sessions() as s:
        job_states.add_checkpoint(s, job_id, 2, prefix, bytes=7000, files=["model.safetensors"])
        s.commit()
    fetched = presigned_checkpoint_file(client, team_a.headers, job_id, 2, "model.safetensors")
    assert fetched.status_code == 200 and fetched.content == b"weights" * 1000

    client.post(f"/v1/jobs/{job_id}/cancel", headers=team_a.headers)  # frees the file
    assert client.delete(f"/v1/files/{file_id}", headers=team_a.headers).status_code == 200
    assert not s3_store.exists(f"{team_a.id}/files/{file_id}.jsonl")


@pytest.mark.parametrize("seconds", [None, 120])
def test_presigned_urls_expire_after_presign_seconds(
    settings, s3_store, queue, db_sessions, team_a, tmp_path, seconds
):
    """A presigned link outlives a revoked key by at most PRESIGN_SECONDS (5 min by default):
    the URL says so in SigV4's X-Amz-Expires, which the store enforces."""
    from urllib.parse import parse_qs, urlsplit

    from tests.api.conftest import checkpoint_file

    if seconds is not None:
        settings = settings.model_copy(update={"PRESIGN_SECONDS": seconds})
    client = TestClient(
        create_app(settings, store=s3_store, queue=queue, session_factory=db_sessions)
    )
    file_id = upload(client, team_a).json()["id"]
    job_id = client.post("/v1/jobs", headers=team_a.headers, json=job_body(file_id)).json()["id"]
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"weights")
    prefix = checkpoint_prefix(team_a.id, job_id, 1)
    s3_store.upload_dir(prefix, tmp_path / "ckpt")
    with db_sessions() as s:
        job_states.add_checkpoint(s, job_id, 1, prefix, bytes=7, files=["model.safetensors"])
        s.commit()
    r = checkpoint_file(
        client, team_a.headers, job_id, 1, "model.safetensors", follow_redirects=False
    )
    assert r.status_code == 307, r.text
    query = parse_qs(urlsplit(r.headers["location"]).query)
    assert query["X-Amz-Expires"] == [str(seconds or 300)]
