"""The ObjectStore contract, run against LocalStore and a real SeaweedFS S3Store."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from storage import (
    COMPLETE_MARKER,
    IncompleteCheckpointError,
    LocalStore,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
)
from storage.keys import checkpoint_prefix, file_key, upload_key

MiB = 1 << 20
BIG = 12 * MiB + 12345  # > the 5 MiB test multipart threshold: three parts, ragged last one


def _payload(n: int) -> bytes:
    """Deterministic, non-repeating bytes (a misplaced part would not go unnoticed)."""
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(i.to_bytes(8, "big")).digest()
        i += 1
    return bytes(out[:n])


def _chunked(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


class Boom(RuntimeError):
    pass


def _failing(data: bytes, fail_after: int, size: int = MiB) -> Iterator[bytes]:
    sent = 0
    for chunk in _chunked(data, size):
        if sent >= fail_after:
            raise Boom("client went away")
        sent += len(chunk)
        yield chunk


# --- round trips ----------------------------------------------------------------------------
@pytest.mark.parametrize("n", [0, 1, 1000, BIG], ids=["empty", "1B", "1kB", "12MiB"])
def test_put_stream_round_trip(store: ObjectStore, n: int, raw_keys: Callable[[], list[str]]):
    data = _payload(n)
    assert store.put_stream("t1/files/f.jsonl", _chunked(data, 777_777)) == n
    assert store.size("t1/files/f.jsonl") == n
    assert b"".join(store.get_stream("t1/files/f.jsonl", chunk_size=MiB)) == data
    assert raw_keys() == ["t1/files/f.jsonl"]  # no temp object left behind


@pytest.mark.parametrize("n", [0, 1000, BIG], ids=["empty", "1kB", "12MiB"])
def test_put_file_and_download_file(store: ObjectStore, tmp_path: Path, n: int, raw_keys):
    data = _payload(n)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    store.put_file("t1/job1/step-1/model.bin", src)
    dest = tmp_path / "out" / "model.bin"
    store.download_file("t1/job1/step-1/model.bin", dest)
    assert dest.read_bytes() == data
    assert sorted(os.listdir(dest.parent)) == ["model.bin"]  # no .part file left
    assert raw_keys() == ["t1/job1/step-1/model.bin"]


def test_put_bytes_overwrites(store: ObjectStore):
    store.put_bytes("a/b", b"one")
    store.put_bytes("a/b", b"two!")
    assert store.get_bytes("a/b") == b"two!"
    assert store.size("a/b") == 4


def test_get_stream_chunking(store: ObjectStore):
    data = _payload(10_000)
    store.put_bytes("k", data)
    chunks = list(store.get_stream("k", chunk_size=4096))
    assert b"".join(chunks) == data
    assert all(len(c) <= 4096 for c in chunks)


def test_missing_objects(store: ObjectStore, tmp_path: Path):
    assert not store.exists("nope")
    with pytest.raises(ObjectNotFound):
        store.size("nope")
    # Raised at the call, not at the first next(): an HTTP handler can still answer 404.
    with pytest.raises(ObjectNotFound):
        store.get_stream("nope")
    (tmp_path / "dl").mkdir()
    with pytest.raises(FileNotFoundError):  # ObjectNotFound is a FileNotFoundError too
        store.download_file("nope", tmp_path / "dl" / "x")
    assert os.listdir(tmp_path / "dl") == []  # no partial file
    with pytest.raises(ObjectNotFound):
        store.move("nope", "other")
    store.delete("nope")  # deleting a missing key is fine


# --- atomicity ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fail_after", [0, 2 * MiB, 11 * MiB], ids=["before-any", "below-threshold", "mid-multipart"]
)
def test_failed_stream_leaves_nothing(store: ObjectStore, raw_keys, fail_after: int):
    with pytest.raises(Boom):
        store.put_stream("t1/files/f.jsonl", _failing(_payload(BIG), fail_after))
    assert raw_keys() == []  # neither the final object nor any temp object
    assert not store.exists("t1/files/f.jsonl")


def test_failed_overwrite_keeps_old_object(store: ObjectStore, raw_keys):
    store.put_bytes("t1/files/f.jsonl", b"old")
    with pytest.raises(Boom):
        store.put_stream("t1/files/f.jsonl", _failing(_payload(BIG), 6 * MiB))
    assert store.get_bytes("t1/files/f.jsonl") == b"old"
    assert raw_keys() == ["t1/files/f.jsonl"]


def test_download_is_atomic_on_failure(store: ObjectStore, tmp_path: Path):
    dest = tmp_path / "dl" / "model.bin"
    dest.parent.mkdir()
    dest.write_bytes(b"previous")
    with pytest.raises(ObjectNotFound):
        store.download_file("missing", dest)
    assert dest.read_bytes() == b"previous"
    assert os.listdir(dest.parent) == ["model.bin"]


# --- listing, deleting, moving --------------------------------------------------------------
def test_list_sorted_and_prefix_semantics(store: ObjectStore):
    keys = ["b/2", "a/10", "a/9", "a/1/x", "ab", "a-z", "c"]
    for k in keys:
        store.put_bytes(k, k.encode())
    assert store.list("") == sorted(keys)
    assert store.list("a/") == ["a/1/x", "a/10", "a/9"]
    assert store.list("a") == ["a-z", "a/1/x", "a/10", "a/9", "ab"]  # string prefix, as S3
    assert store.list("a/1") == ["a/1/x", "a/10"]
    assert store.list("zzz/") == []


def test_list_hides_in_flight_temp_objects(store: ObjectStore):
    seen: list[list[str]] = []

    def chunks() -> Iterator[bytes]:
        yield b"x" * 1000
        seen.append(store.list(""))  # listed while the upload is in flight
        yield b"y"

    store.put_stream("t1/files/f.jsonl", chunks())
    assert seen == [[]]
    assert store.list("") == ["t1/files/f.jsonl"]


def test_delete_and_delete_prefix(store: ObjectStore, raw_keys):
    for k in ["t1/j1/step-1/a", "t1/j1/step-1/sub/b", "t1/j1/step-10/a", "t1/j2/x", "t2/j1/x"]:
        store.put_bytes(k, b"1")
    store.delete("t1/j2/x")
    assert not store.exists("t1/j2/x")
    store.delete_prefix("t1/j1/step-1/")
    assert store.list("") == ["t1/j1/step-10/a", "t2/j1/x"]
    store.delete_prefix("t1/")
    assert raw_keys() == ["t2/j1/x"]
    with pytest.raises(ValueError):
        store.delete_prefix("")  # never "the whole store"


def test_move_publishes_an_upload(store: ObjectStore, raw_keys):
    data = _payload(BIG)
    src, dst = upload_key("t1", "file1"), file_key("t1", "file1")
    store.put_stream(src, _chunked(data, MiB))
    store.move(src, dst)
    assert not store.exists(src)
    assert b"".join(store.get_stream(dst)) == data
    assert raw_keys() == [dst]
    store.put_bytes(src, b"replacement")
    store.move(src, dst)  # replaces an existing destination
    assert store.get_bytes(dst) == b"replacement"


# --- presigned URLs -------------------------------------------------------------------------
def test_presigned_url(store: ObjectStore):
    data = _payload(3000)
    store.put_bytes("t1/job1/step-1/model.bin", data)
    url = store.presigned_url("t1/job1/step-1/model.bin", expires=60)
    if isinstance(store, LocalStore):
        assert url is None
        return
    assert url is not None
    resp = httpx.get(url, timeout=10)
    assert resp.status_code == 200
    assert resp.content == data
    tampered = url.replace("model.bin", "other.bin")
    assert httpx.get(tampered, timeout=10).status_code == 403


# --- checkpoint directories -----------------------------------------------------------------
def _make_checkpoint(root: Path) -> dict[str, bytes]:
    files = {
        "config.json": b'{"layers": 2}',
        "model.safetensors": _payload(6 * MiB + 1),
        "tokenizer/vocab.txt": b"a\nb\n",
        "empty.txt": b"",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_upload_dir_download_dir_round_trip(store: ObjectStore, tmp_path: Path):
    files = _make_checkpoint(tmp_path / "ckpt")
    prefix = checkpoint_prefix("t1", "job1", 3)
    keys = store.upload_dir(prefix, tmp_path / "ckpt")
    assert keys[-1] == prefix + COMPLETE_MARKER  # the marker is written last
    assert sorted(keys[:-1]) == sorted(prefix + rel for rel in files)
    manifest = json.loads(store.get_bytes(prefix + COMPLETE_MARKER))
    assert {f["path"]: f["size"] for f in manifest["files"]} == {
        rel: len(data) for rel, data in files.items()
    }
    store.download_dir(prefix, tmp_path / "out" / "restored")
    assert _read_tree(tmp_path / "out" / "restored") == files
    assert os.listdir(tmp_path / "out") == ["restored"]  # staging dir removed


def test_torn_checkpoint_is_refused(store: ObjectStore, tmp_path: Path):
    _make_checkpoint(tmp_path / "ckpt")
    prefix = checkpoint_prefix("t1", "job1", 4)
    store.upload_dir(prefix, tmp_path / "ckpt")
    store.delete(prefix + COMPLETE_MARKER)  # as if the writer died before the marker
    assert not store.is_complete(prefix)
    with pytest.raises(IncompleteCheckpointError, match="no _COMPLETE marker"):
        store.download_dir(prefix, tmp_path / "restored")
    assert not (tmp_path / "restored").exists()
    with pytest.raises(IncompleteCheckpointError):
        store.download_dir(checkpoint_prefix("t1", "job1", 99), tmp_path / "restored")


def test_checkpoint_missing_a_listed_file_is_refused(store: ObjectStore, tmp_path: Path):
    _make_checkpoint(tmp_path / "ckpt")
    prefix = checkpoint_prefix("t1", "job1", 5)
    store.upload_dir(prefix, tmp_path / "ckpt")
    store.delete(prefix + "model.safetensors")
    dest = tmp_path / "out" / "restored"
    dest.mkdir(parents=True)
    (dest / "keep.txt").write_bytes(b"mine")
    with pytest.raises(IncompleteCheckpointError, match="model.safetensors"):
        store.download_dir(prefix, dest)
    assert _read_tree(dest) == {"keep.txt": b"mine"}  # nothing half-written into dest
    assert os.listdir(tmp_path / "out") == ["restored"]  # staging dir removed


def test_reupload_replaces_torn_attempt(store: ObjectStore, tmp_path: Path):
    prefix = checkpoint_prefix("t1", "job1", 6)
    store.put_bytes(prefix + "stale-shard.bin", b"from a crashed attempt")
    files = _make_checkpoint(tmp_path / "ckpt")
    store.upload_dir(prefix, tmp_path / "ckpt")
    assert store.list(prefix) == sorted([prefix + r for r in files] + [prefix + COMPLETE_MARKER])
    store.download_dir(prefix, tmp_path / "restored")
    assert _read_tree(tmp_path / "restored") == files


def test_upload_dir_refuses_marker_named_file(store: ObjectStore, tmp_path: Path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / COMPLETE_MARKER).write_bytes(b"")
    with pytest.raises(ValueError):
        store.upload_dir(checkpoint_prefix("t1", "job1", 1), tmp_path / "ckpt")
    assert store.list("") == []


def test_a_locally_committed_dir_uploads_exactly_its_manifest(store: ObjectStore, tmp_path: Path):
    """The trainer commits a checkpoint dir with a local `_COMPLETE` manifest (trainer.checkpoint):
    the upload sends the files it lists, not the marker as data, and writes the store's marker
    last; a download can keep the marker, so the copy is committed for a resume too."""
    files = _make_checkpoint(tmp_path / "ckpt")
    listed = [{"path": rel, "size": len(data)} for rel, data in files.items()]
    marker = json.dumps({"version": 1, "files": listed})
    (tmp_path / "ckpt" / COMPLETE_MARKER).write_text(marker)
    (tmp_path / "ckpt" / "late.txt").write_bytes(b"written after the commit")
    prefix = checkpoint_prefix("t1", "job1", 7)
    keys = store.upload_dir(prefix, tmp_path / "ckpt")
    assert keys[-1] == prefix + COMPLETE_MARKER
    assert sorted(keys[:-1]) == sorted(prefix + rel for rel in files)
    store.download_dir(prefix, tmp_path / "back", keep_marker=True)
    back = _read_tree(tmp_path / "back")
    assert json.loads(back.pop(COMPLETE_MARKER))["files"] == sorted(listed, key=lambda f: f["path"])
    assert back == files
    assert store.upload_dir(prefix, tmp_path / "back")[:-1] == keys[:-1]  # and up again

    (tmp_path / "ckpt" / "empty.txt").write_bytes(b"changed after the commit")
    with pytest.raises(ValueError, match="does not hold the files"):
        store.upload_dir(prefix, tmp_path / "ckpt")


# --- key checks at the store boundary -------------------------------------------------------
@pytest.mark.parametrize(
    "key",
    [
        "../x",
        "/etc/passwd",
        "a/../../b",
        "a/./b",
        "a//b",
        "a\x00b",
        "a\\b",
        "",
        ".tmp/x",
        "x" * 1025,
    ],
)
def test_store_refuses_bad_keys(store: ObjectStore, key: str, tmp_path: Path):
    with pytest.raises(ValueError):
        store.put_bytes(key, b"x")
    with pytest.raises(ValueError):
        store.get_stream(key)
    with pytest.raises(ValueError):
        store.exists(key)
    with pytest.raises(ValueError):
        store.download_file(key, tmp_path / "x")
    with pytest.raises(ValueError):
        store.move("ok", key)
    with pytest.raises(ValueError):
        store.presigned_url(key)
    assert store.list("") == []


# --- temporary objects: one rule for both backends (storage.base.temp_name) -----------------
def _leave_temp(store: ObjectStore) -> None:
    """A temporary object as a writer that died leaves it."""
    if isinstance(store, LocalStore):
        fd, _ = store._temp_file()
        os.close(fd)
    else:
        store._client.put_object(Bucket=store.bucket, Key=store._tmp_key(), Body=b"t")


def test_delete_temp_removes_a_listed_temporary_object(store: ObjectStore, raw_keys):
    _leave_temp(store)
    (obj,) = store.scan_temp()
    store.delete_temp(obj)
    assert store.scan_temp() == [] and raw_keys() == []


@pytest.mark.parametrize(
    "key",
    [".tmp", ".tmp/", ".tmp/.", ".tmp/..", ".tmp/../a", ".tmp/a/b", ".tmp/a\\b", "a/b", "tmp/x"],
)
def test_delete_temp_refuses_the_same_names_on_both_backends(
    store: ObjectStore, key: str, raw_keys
):
    store.put_bytes("a/b", b"kept")
    _leave_temp(store)
    before = raw_keys()
    with pytest.raises(ValueError, match="not a temporary object"):
        store.delete_temp(ObjectInfo(key, 1, 0.0))
    assert raw_keys() == before
