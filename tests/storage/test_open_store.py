"""open_store picks the backend from the URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import LocalStore, S3Store, open_store


def test_file_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    abs_store = open_store(f"file://{tmp_path}/objects")
    assert isinstance(abs_store, LocalStore)
    assert abs_store.root == (tmp_path / "objects").resolve()
    monkeypatch.chdir(tmp_path)
    rel_store = open_store("file://./rel/objects")
    assert isinstance(rel_store, LocalStore)
    assert rel_store.root == (tmp_path / "rel" / "objects").resolve()


@pytest.mark.parametrize(
    "url", ["file://", "s3://", "s3:///prefix", "http://x", "/tmp/x", "gs://b"]
)
def test_bad_urls(url: str):
    with pytest.raises(ValueError):
        open_store(url)


# open_store's keywords for the region and credentials, and boto3's (the settings class's)
OURS = ("region", "access_key", "secret_key")
BOTO3 = ("region_name", "aws_access_key_id", "aws_secret_access_key")


def _open(s3_server, url: str, spelling: tuple[str, str, str]):
    values = (s3_server.region, s3_server.access_key, s3_server.secret_key)
    credentials = dict(zip(spelling, values, strict=True))
    return open_store(url, endpoint_url=s3_server.endpoint_url, **credentials)


def test_s3_url_creates_bucket_and_applies_prefix(s3_server):
    bucket = f"open-{__import__('uuid').uuid4().hex[:10]}"
    try:
        store = _open(s3_server, f"s3://{bucket}/env/prod", OURS)
        assert isinstance(store, S3Store)
        store.put_bytes("t1/files/f.jsonl", b"{}")
        assert store.list("") == ["t1/files/f.jsonl"]
        assert s3_server.list_all(bucket) == ["env/prod/t1/files/f.jsonl"]
        again = _open(s3_server, f"s3://{bucket}/env/prod", BOTO3)  # accepted too
        assert again.get_bytes("t1/files/f.jsonl") == b"{}"
    finally:
        s3_server.delete_bucket(bucket)


def test_both_stores_satisfy_the_protocol(local_store, s3_store):
    from storage import ObjectStore

    assert isinstance(local_store, ObjectStore)
    assert isinstance(s3_store, ObjectStore)
