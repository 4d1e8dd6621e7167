"""Path traversal: neither file names, job metadata nor checkpoint file names steer an object
key out of the team's prefix."""

from __future__ import annotations

import re

import pytest

from storage.keys import checkpoint_prefix
from tests.api.conftest import checkpoint_file, job_body, stored_objects, upload
from tests.security.conftest import MARKER

HOSTILE_NAMES = [
    "../../../etc/passwd",
    "..\\..\\windows\\system32",
    "/etc/passwd",
    "a/../../b.jsonl",
    "%2e%2e%2f%2e%2e%2fx",
    "x\x00.jsonl",
    "team-other/file-1",
    "." * 300,
    "名前/../../秘密.jsonl",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_file_names_never_steer_object_keys(client, team_a, store, name):
    r = upload(client, team_a, filename=name)
    assert r.status_code in (201, 400, 422), r.text
    for key in stored_objects(store):
        assert key.startswith(f"{team_a.id}/"), key
        assert ".." not in key.split("/") and "\x00" not in key and "\\" not in key, key
    if r.status_code == 201:
        f = r.json()
        assert (
            "/" not in f["filename"] and "\\" not in f["filename"] and "\x00" not in f["filename"]
        )
        assert f["id"].startswith("file-")


def test_job_metadata_never_steers_object_keys(client, team_a, store, db_sessions, train_file_a):
    """Traversal-looking metadata (ours) and suffix (OpenAI's) are accepted as plain data:
    the job is created (the check below runs) and every key is the team's, made from ids."""
    from models.tables import Job

    steer = {"out": "../../../x", "team": "../team-b", "prefix": f"{team_a.id}/../../etc"}
    body = job_body(train_file_a, metadata=steer)
    ours = client.post("/v1/jobs", headers=team_a.headers, json=body)
    assert ours.status_code == 201, ours.text
    theirs = client.post(
        "/v1/fine_tuning/jobs", headers=team_a.headers,
        json={"model": "tiny-llama", "training_file": train_file_a, "suffix": "../x",
              "metadata": steer,
              "method": {"type": "dpo", "dpo": {"hyperparameters": {"batch_size": 4}}}},
    )
    assert theirs.status_code == 200, theirs.text
    for job_id in (ours.json()["id"], theirs.json()["id"]):
        assert re.fullmatch(r"job-[0-9a-f]+", job_id), job_id
        with db_sessions() as s:
            job = s.get(Job, job_id)
            assert job.team_id == team_a.id and job.meta["out"] == "../../../x"
            prefix = checkpoint_prefix(job.team_id, job.id, 1)
        assert prefix.startswith(f"{team_a.id}/") and job_id in prefix
        assert not any(part in ("..", "x", "team-b", "etc") for part in prefix.split("/")), prefix
    keys = stored_objects(store)
    assert keys, "the training file's object"
    for key in keys:
        assert key.startswith(f"{team_a.id}/") and ".." not in key.split("/"), key


@pytest.mark.parametrize(
    "name",
    [
        "../../../etc/passwd",
        "..%2f..%2fetc%2fpasswd",
        "%2e%2e/%2e%2e/model.safetensors",
        "model.safetensors/../../step-4/model.safetensors",
        "..\\model.safetensors",
        "model.safetensors\x00.png",
        "./model.safetensors",
        "//model.safetensors",
        "../step-4/model.safetensors",
        f"../../../{'x' * 200}",
    ],
)
def test_checkpoint_download_refuses_path_tricks(client, team_a, world, name):
    r = checkpoint_file(client, team_a.headers, world.job, 4, name)
    assert r.status_code in (404, 422), (name, r.text)
    assert MARKER not in r.text
