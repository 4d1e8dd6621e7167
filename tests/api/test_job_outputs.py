"""What a job leaves: checkpoints (listed, downloaded only by listed name, presigned
redirects), the exported model once the job succeeded, and other teams seeing none of it."""

from __future__ import annotations

import pytest

from models import jobs as job_states
from tests.api.conftest import (
    checkpoint_file,
    claim_job,
    create_job,
)


@pytest.fixture
def job_with_checkpoint(client, team_a, train_file, db_sessions, store, tmp_path):
    from storage.keys import checkpoint_prefix

    job_id = create_job(client, team_a, train_file)["id"]
    ckpt_dir = tmp_path / "ckpt"
    (ckpt_dir / "tokenizer").mkdir(parents=True)
    (ckpt_dir / "model.safetensors").write_bytes(b"\x00weights" * 100)
    (ckpt_dir / "tokenizer" / "vocab.json").write_text("{}")
    prefix = checkpoint_prefix(team_a.id, job_id, 4)
    store.upload_dir(prefix, ckpt_dir)
    with db_sessions() as s:
        job_states.add_checkpoint(
            s, job_id, 4, prefix, bytes=802, files=["model.safetensors", "tokenizer/vocab.json"]
        )
        s.commit()
    return job_id


def test_checkpoints_list_and_download(client, team_a, job_with_checkpoint):
    job_id = job_with_checkpoint
    listing = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=team_a.headers).json()
    assert [(c["step"], c["bytes"], c["files"]) for c in listing["data"]] == [
        (4, 802, ["model.safetensors", "tokenizer/vocab.json"])
    ]
    r = checkpoint_file(client, team_a.headers, job_id, 4, "model.safetensors")
    assert r.status_code == 200 and r.content == b"\x00weights" * 100
    assert 'filename="model.safetensors"' in r.headers["content-disposition"]
    nested = checkpoint_file(client, team_a.headers, job_id, 4, "tokenizer/vocab.json")
    assert nested.status_code == 200 and nested.content == b"{}"


@pytest.mark.parametrize(
    "name",
    [
        "../../../etc/passwd",
        "missing.bin",
        "/model.safetensors",
        "tokenizer/../model.safetensors",
        "step-4/model.safetensors",
    ],
)
def test_checkpoint_download_serves_only_listed_files(client, team_a, job_with_checkpoint, name):
    r = checkpoint_file(client, team_a.headers, job_with_checkpoint, 4, name)
    assert r.status_code == 404 and r.json()["error"]["field"] == "file"


def test_checkpoint_download_of_a_missing_step_is_404(client, team_a, job_with_checkpoint):
    r = checkpoint_file(client, team_a.headers, job_with_checkpoint, 5, "model.safetensors")
    assert r.status_code == 404 and r.json()["error"]["field"] == "step"


def test_checkpoint_download_redirects_to_a_presigned_url(
    client, team_a, job_with_checkpoint, store, monkeypatch
):
    monkeypatch.setattr(
        store, "presigned_url", lambda key, expires=3600: f"https://s3.example/{key}?sig=1"
    )
    r = checkpoint_file(
        client, team_a.headers, job_with_checkpoint, 4, "model.safetensors", follow_redirects=False
    )
    assert r.status_code == 307
    assert r.headers["location"].startswith("https://s3.example/")
    assert r.headers["location"].endswith("/step-4/model.safetensors?sig=1")


def test_teams_cannot_see_or_touch_each_others_jobs(
    client, team_a, team_b, job_with_checkpoint, queue
):
    job_id = job_with_checkpoint
    for method, path, params in [
        ("GET", f"/v1/jobs/{job_id}", None),
        ("POST", f"/v1/jobs/{job_id}/cancel", None),
        ("GET", f"/v1/jobs/{job_id}/events", None),
        ("GET", f"/v1/jobs/{job_id}/events/stream", None),
        ("GET", f"/v1/jobs/{job_id}/metrics", None),
        ("GET", f"/v1/jobs/{job_id}/checkpoints", None),
        ("GET", f"/v1/jobs/{job_id}/checkpoints/4/download", {"file": "model.safetensors"}),
    ]:
        r = client.request(method, path, headers=team_b.headers, params=params)
        assert r.status_code == 404, (method, path, r.text)
        assert r.json()["error"]["type"] == "not_found_error"
    assert client.get("/v1/jobs", headers=team_b.headers).json()["data"] == []
    assert client.get(f"/v1/jobs/{job_id}", headers=team_a.headers).json()["status"] == "queued"


def test_exported_model_downloads_once_the_job_succeeded(
    client, team_a, team_b, train_file, db_sessions, store, tmp_path
):
    from storage.keys import job_prefix

    job_id = create_job(client, team_a, train_file)["id"]
    url = f"/v1/jobs/{job_id}/model/download"
    early = client.get(url, headers=team_a.headers, params={"file": "adapter_model.safetensors"})
    assert early.status_code == 404 and early.json()["error"]["field"] == "job_id"
    final = tmp_path / "final"
    final.mkdir()
    (final / "adapter_model.safetensors").write_bytes(b"\x01adapter")
    prefix = job_prefix(team_a.id, job_id) + "final/"
    store.upload_dir(prefix, final)
    claim_job(db_sessions, job_id)
    with db_sessions() as s:
        result = {"final_model": {"prefix": prefix, "files": ["adapter_model.safetensors"]}}
        assert job_states.finish(s, job_id, "w1", "succeeded", result=result)
        s.commit()
    ok = client.get(url, headers=team_a.headers, params={"file": "adapter_model.safetensors"})
    assert ok.status_code == 200 and ok.content == b"\x01adapter"
    for name in ("../final/adapter_model.safetensors", "_COMPLETE/../x", "missing"):
        r = client.get(url, headers=team_a.headers, params={"file": name})
        assert r.status_code == 404 and r.json()["error"]["field"] == "file", name
    other = client.get(url, headers=team_b.headers, params={"file": "adapter_model.safetensors"})
    assert other.status_code == 404


def test_the_completion_marker_is_neither_listed_nor_served(client, team_a, job_with_checkpoint):
    r = checkpoint_file(client, team_a.headers, job_with_checkpoint, 4, "_COMPLETE")
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert "_COMPLETE" not in message.split("it has")[-1] and "model.safetensors" in message


@pytest.mark.parametrize("value", [2**31, 2**63, 2**64])
def test_steps_past_int4_are_422_naming_the_parameter(
    client, team_a, job_with_checkpoint, value
):
    """Steps are int4 columns; on SQLite a step >= 2**63 raised OverflowError (a 500)."""
    job_id = job_with_checkpoint
    for name in ("from_step", "to_step"):
        r = client.get(
            f"/v1/jobs/{job_id}/metrics", headers=team_a.headers, params={name: value}
        )
        assert r.status_code == 422, (name, r.text)
        assert r.json()["error"]["field"] == name
    r = checkpoint_file(client, team_a.headers, job_id, value, "model.safetensors")
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == "step"
    ok = client.get(
        f"/v1/jobs/{job_id}/metrics", headers=team_a.headers, params={"to_step": 2**31 - 1}
    )
    assert ok.status_code == 200 and ok.json()["data"] == []
