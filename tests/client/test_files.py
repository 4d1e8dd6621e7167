"""client.files against the real API: upload (every input kind), list (lazy pages),
retrieve, content, delete."""

from __future__ import annotations

import io
import itertools

import pytest

from humanline_client import (
    ConflictError,
    CursorPage,
    FileObject,
    NotFoundError,
    UnprocessableEntityError,
)

from .conftest import PREFERENCE, jsonl

UNPAIRED = jsonl([{"prompt": f"Q{i}", "completion": "A", "label": i % 2 == 0} for i in range(4)])
EVAL_MATH = jsonl([{"problem": "1+1?", "answer": "2"}])


def test_upload_from_path_bytes_file_object_and_tuple(client, tmp_path):
    path = tmp_path / "prefs.jsonl"
    path.write_bytes(PREFERENCE)
    from_path = client.files.upload(file=path)
    assert isinstance(from_path, FileObject)
    assert (from_path.filename, from_path.purpose, from_path.format) == (
        "prefs.jsonl",
        "train",
        "preference",
    )
    assert from_path.records == 8 and from_path.bytes == len(PREFERENCE)
    assert from_path.id.startswith("file-") and from_path._request_id

    from_str_path = client.files.upload(file=str(path), filename="renamed.jsonl")
    assert from_str_path.filename == "renamed.jsonl"

    from_bytes = client.files.upload(file=UNPAIRED, purpose="train")
    assert (from_bytes.format, from_bytes.filename) == ("unpaired", "upload.jsonl")

    with open(path, "rb") as fh:
        assert client.files.upload(file=fh).filename == "prefs.jsonl"

    from_tuple = client.files.upload(file=("math.jsonl", io.BytesIO(EVAL_MATH)), purpose="eval")
    assert (from_tuple.filename, from_tuple.purpose) == ("math.jsonl", "eval")


def test_upload_rejects_bad_lines_with_their_numbers(client):
    bad = PREFERENCE + b'{"prompt": "x", "chosen": ""}\nnot json\n'
    with pytest.raises(UnprocessableEntityError) as info:
        client.files.upload(file=bad)
    err = info.value
    assert err.status_code == 422 and err.request_id
    lines = {e.get("line") for e in err.errors}
    assert {9, 10} <= lines
    assert list(client.files.list()) == []  # nothing left behind


def test_upload_missing_path_fails_before_any_request(client, tmp_path):
    with pytest.raises(FileNotFoundError):
        client.files.upload(file=tmp_path / "nope.jsonl")


def test_list_is_lazy_and_pages_through_everything(client, server):
    ids = [client.files.upload(file=PREFERENCE, filename=f"f{i}.jsonl").id for i in range(5)]
    listing = client.files.list(limit=2)  # no request yet
    first = listing.first_page()
    assert isinstance(first, CursorPage)
    assert len(first.data) == 2 and first.has_more and first.last_id == first.data[-1].id
    pages = list(listing.pages())
    assert [len(p.data) for p in pages] == [2, 2, 1]
    assert pages[-1].next_page() is None and not pages[-1].has_next_page()
    assert [f.id for f in listing] == sorted(ids, reverse=True)  # newest first
    # stopping early fetches only what it needs
    assert [f.id for f in itertools.islice(client.files.list(limit=2), 3)] == sorted(
        ids, reverse=True
    )[:3]
    second = first.next_page()
    assert second is not None and second.data[0].id == pages[1].data[0].id
    assert client.files.list(after=ids[2], limit=100).to_list()[0].id == ids[1]


def test_list_filters_by_purpose(client):
    train = client.files.upload(file=PREFERENCE)
    ev = client.files.upload(file=EVAL_MATH, purpose="eval")
    assert [f.id for f in client.files.list(purpose="eval")] == [ev.id]
    assert [f.id for f in client.files.list(purpose="train")] == [train.id]


def test_retrieve_content_and_delete(client, tmp_path):
    f = client.files.upload(file=PREFERENCE)
    assert client.files.retrieve(f.id).sha256 == f.sha256
    assert client.files.content(f.id) == PREFERENCE
    out = client.files.content(f.id, to=tmp_path / "copy.jsonl")
    assert out == tmp_path / "copy.jsonl" and out.read_bytes() == PREFERENCE
    assert not (tmp_path / "copy.jsonl.part").exists()
    deleted = client.files.delete(f.id)
    assert deleted.deleted and deleted.id == f.id
    with pytest.raises(NotFoundError) as info:
        client.files.retrieve(f.id)
    assert info.value.field == "file_id"


def test_delete_refused_while_a_job_trains_on_it(client, train_file):
    client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    with pytest.raises(ConflictError) as info:
        client.files.delete(train_file)
    assert info.value.status_code == 409 and "active job" in info.value.message


def test_other_teams_files_are_invisible(server, client, train_file):
    _, other_key = server.new_team()
    from humanline_client import Client

    with Client(base_url=server.url, api_key=other_key) as other:
        assert list(other.files.list()) == []
        with pytest.raises(NotFoundError):
            other.files.content(train_file)


def test_a_file_can_be_deleted_once_its_jobs_are_finished(client, train_file):
    job = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    client.jobs.cancel(job.id)
    assert client.files.delete(train_file).deleted
    assert client.jobs.retrieve(job.id).training_file == train_file  # the spec keeps the id
