"""Key builders and key checks: ids only, no way out of a store's root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storage import LocalStore
from storage.keys import (
    check_id,
    check_key,
    checkpoint_prefix,
    file_key,
    final_model_prefix,
    job_prefix,
    parse_checkpoint_step,
    report_key,
    upload_key,
)

BAD_IDS = [
    "",
    "../x",
    "..",
    ".",
    "/etc/passwd",
    "a/../../b",
    "a/b",
    "a\x00b",
    "a b",
    "-leading-dash",
    "_leading",
    "x" * 65,
    "é",
    "a\nb",
    "a.b",
    "a\\b",
]


def test_layout():
    assert file_key("team1", "file_1") == "team1/files/file_1.jsonl"
    assert upload_key("team1", "file_1") == "team1/uploads/file_1.jsonl"
    assert job_prefix("team1", "job-1") == "team1/job-1/"
    assert checkpoint_prefix("team1", "job-1", 0) == "team1/job-1/step-0/"
    assert checkpoint_prefix("team1", "job-1", 250) == "team1/job-1/step-250/"
    assert final_model_prefix("team1", "job-1") == "team1/job-1/final/"
    assert report_key("team1", "job-1", "eval.json") == "team1/job-1/reports/eval.json"
    assert parse_checkpoint_step("team1/job-1/step-250/") == 250
    assert check_id("x" * 64) == "x" * 64


@pytest.mark.parametrize("bad", BAD_IDS + [None, 5])
def test_bad_ids_rejected(bad):
    with pytest.raises(ValueError):
        file_key(bad, "f1")
    with pytest.raises(ValueError):
        file_key("t1", bad)
    with pytest.raises(ValueError):
        checkpoint_prefix("t1", bad, 1)
    with pytest.raises(ValueError):
        final_model_prefix("t1", bad)
    with pytest.raises(ValueError):
        report_key(bad, "j1", "eval.json")


@pytest.mark.parametrize(
    "prefix",
    ["t1/j1/step-01/", "t1/j1/step-/", "t1/j1/step-1", "t1/j1/x/step-1/", "t1/j1/final/", ""],
)
def test_parse_checkpoint_step_refuses_other_prefixes(prefix):
    with pytest.raises(ValueError):
        parse_checkpoint_step(prefix)


@pytest.mark.parametrize("step", [-1, True, 1.0, "1", None])
def test_bad_steps_rejected(step):
    with pytest.raises(ValueError):
        checkpoint_prefix("t1", "j1", step)


@pytest.mark.parametrize(
    "name", ["../x", "..", "a/b", "/etc/passwd", "x\x00", "", ".hidden", "a..b"]
)
def test_bad_report_names_rejected(name):
    with pytest.raises(ValueError):
        report_key("t1", "j1", name)


@pytest.mark.parametrize("job", ["files", "uploads"])
def test_job_ids_cannot_shadow_team_namespaces(job):
    with pytest.raises(ValueError):
        job_prefix("t1", job)


@pytest.mark.parametrize(
    "key",
    ["../x", "/etc/passwd", "a/../../b", "..", ".", "a/.", "a//b", "a/", "a\x00", "a\x7f",
     "a\\..\\b", "", ".tmp/x", ".tmp", "x" * 1025, "é" * 513],
)  # fmt: skip
def test_check_key_rejects(key):
    with pytest.raises(ValueError):
        check_key(key)


def test_check_key_prefix_mode():
    assert check_key("", prefix=True) == ""
    assert check_key("a/b/", prefix=True) == "a/b/"
    assert check_key("a/b", prefix=True) == "a/b"
    for bad in ["../", "a/../", "/a/", "a//", ".tmp/"]:
        with pytest.raises(ValueError):
            check_key(bad, prefix=True)


def test_local_store_refuses_symlink_escape(tmp_path: Path):
    """Key rules forbid '..'; the LocalStore also checks where a path really lands, so a
    symlink planted inside the root cannot lead outside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    store = LocalStore(tmp_path / "root")
    os.symlink(outside, store.root / "link")
    with pytest.raises(ValueError, match="outside"):
        store.get_stream("link/secret")
    with pytest.raises(ValueError, match="outside"):
        store.put_bytes("link/new", b"x")
    assert sorted(os.listdir(outside)) == ["secret"]


def test_run_keys_of_a_multi_node_attempt():
    from storage.keys import run_file_key, run_prefix, run_spec_key

    assert run_prefix("team-1", "job-2", 3) == "team-1/job-2/run/attempt-3/"
    assert run_spec_key("team-1", "job-2", 1) == "team-1/job-2/run/attempt-1/spec.json"
    assert run_file_key("t", "j", 2, "metrics.jsonl") == "t/j/run/attempt-2/metrics.jsonl"
    for bad in (0, -1, True, "1", 1.0):
        with pytest.raises(ValueError, match="attempt"):
            run_prefix("t", "j", bad)
    for name in ("../x", "a/b", "", ".."):
        with pytest.raises(ValueError, match="run file name"):
            run_file_key("t", "j", 1, name)
    with pytest.raises(ValueError):
        run_prefix("t", "files", 1)  # a job id may not name a team namespace


def test_object_url_names_a_key_for_a_process_that_shares_no_disk(tmp_path):
    from storage import S3Store, object_url

    local = LocalStore(tmp_path)
    assert object_url(local, "t/j/") == f"{local.root}/t/j/"
    assert object_url(local, "t/files/f.jsonl") == f"{local.root}/t/files/f.jsonl"
    s3 = S3Store.__new__(S3Store)  # no client: the URL is a pure function of bucket and prefix
    s3.bucket, s3.prefix = "b", "p/"
    assert object_url(s3, "t/j/run/attempt-1/") == "s3://b/p/t/j/run/attempt-1/"
    with pytest.raises(ValueError):
        object_url(s3, "../x")
