"""Per-team storage quota (issue 14, finding 13): a team's files, checkpoints and exported
models (bytes the database records) are counted; an upload that would take them past
TEAM_STORAGE_QUOTA_GIB is refused with 413 and leaves neither a row nor an object, also when
many arrive at once (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import func, select

from models import jobs as job_states
from models.quota import storage_use
from models.settings import GiB
from models.tables import Checkpoint, File, Job
from tests.api.conftest import PREFERENCE, jsonl, stored_objects, upload

S = len(PREFERENCE)


def _quota(settings, n_bytes: float) -> None:
    settings.TEAM_STORAGE_QUOTA_GIB = n_bytes / GiB


def _files(db_sessions, team_id: str) -> int:
    with db_sessions() as s:
        return s.execute(
            select(func.count()).select_from(File).where(File.team_id == team_id)
        ).scalar_one()


def _dpo_job(s, team_id: str, training_file_id: str | None, steps: int):
    return job_states.create_job(
        s,
        team_id=team_id,
        spec={"base_model": "tiny-llama", "objective": {"name": "dpo"}},
        metadata={},
        training_file_id=training_file_id,
        total_steps=steps,
    )


def test_an_upload_past_the_quota_is_413_and_leaves_nothing(
    client, team_a, team_b, settings, store, db_sessions
):
    _quota(settings, 2.5 * S)
    assert upload(client, team_a).status_code == 201
    assert upload(client, team_a).status_code == 201
    r = upload(client, team_a)
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["type"] == "storage_quota_exceeded" and err["field"] == "file"
    assert "storage quota" in err["message"] and f"files {2 * S} bytes" in err["message"]
    assert r.headers["x-should-retry"] == "false"
    assert _files(db_sessions, team_a.id) == 2 and len(stored_objects(store)) == 2
    # a quota per team: team B still has all of its own
    assert upload(client, team_b).status_code == 201


def test_an_upload_larger_than_the_room_left_is_cut_and_refused(
    client, team_a, settings, store, db_sessions
):
    """Below MAX_UPLOAD_BYTES but above the room left: the stream stops at the room, 413
    names the quota (not the upload limit), and nothing is kept."""
    _quota(settings, S + 100)
    assert upload(client, team_a).status_code == 201
    big = jsonl([{"prompt": f"Q{i}?", "chosen": "good", "rejected": "bad"} for i in range(40)])
    assert 100 < len(big) < settings.MAX_UPLOAD_BYTES
    r = upload(client, team_a, big)
    assert r.status_code == 413 and "storage quota" in r.json()["error"]["message"], r.text
    assert "100 bytes left" in r.json()["error"]["message"]
    assert _files(db_sessions, team_a.id) == 1 and len(stored_objects(store)) == 1
    # a team already at its quota is refused before its body is read
    _quota(settings, S)
    r = upload(client, team_a)
    assert r.status_code == 413 and _files(db_sessions, team_a.id) == 1


def test_checkpoints_and_exported_models_count(client, team_a, settings, db_sessions):
    train = upload(client, team_a).json()["id"]
    with db_sessions() as s:
        job = _dpo_job(s, team_a.id, train, steps=2)
        s.flush()
        s.add(Checkpoint(job_id=job.id, step=1, object_prefix="p/", bytes=1000))
        s.execute(Job.__table__.update().where(Job.id == job.id).values(model_bytes=2000))
        s.commit()
        use = storage_use(s, team_a.id)
    assert (use.files, use.checkpoints, use.models, use.total) == (S, 1000, 2000, S + 3000)
    _quota(settings, 2 * S + 2999)  # room for a second file, but not with the rest
    r = upload(client, team_a)
    assert r.status_code == 413, r.text
    message = r.json()["error"]["message"]
    assert "checkpoints 1000 bytes" in message and "models 2000 bytes" in message
    _quota(settings, 2 * S + 3000)
    assert upload(client, team_a).status_code == 201


def test_deleting_a_file_makes_room(client, team_a, settings):
    _quota(settings, S)
    first = upload(client, team_a).json()["id"]
    assert upload(client, team_a).status_code == 413
    assert client.delete(f"/v1/files/{first}", headers=team_a.headers).status_code == 200
    assert upload(client, team_a).status_code == 201


def test_concurrent_uploads_never_go_past_the_quota(client, team_a, settings, store, db_sessions):
    """Every upload passes the check made before its body is read (the team stores nothing
    yet); only the count under the team's lock after the insert keeps them to the quota:
    exactly 5 of 20 at a quota of 5 files, and the refused ones leave no object."""
    _quota(settings, 5 * S + S // 2)
    n = 20
    barrier = threading.Barrier(n)

    def send(_):
        barrier.wait()
        return upload(client, team_a).status_code

    with ThreadPoolExecutor(n) as pool:
        codes = list(pool.map(send, range(n)))
    assert codes.count(201) == 5 and set(codes) == {201, 413}, codes
    assert _files(db_sessions, team_a.id) == 5
    assert len(stored_objects(store)) == 5


def test_a_succeeded_job_records_its_models_bytes(db_sessions, team_a):
    """The worker reports the exported model's size in result.final_model.bytes; finish()
    keeps it in jobs.model_bytes, which the quota sums."""
    with db_sessions() as s:
        job = _dpo_job(s, team_a.id, None, steps=1)
        s.commit()
        assert job_states.claim(s, job.id, "w1", lease_seconds=60) is not None
        s.commit()
        result = {"final_model": {"prefix": "x/", "files": ["a"], "bytes": 12345}}
        assert job_states.finish(s, job.id, "w1", "succeeded", result=result)
        s.commit()
        assert storage_use(s, team_a.id).models == 12345
