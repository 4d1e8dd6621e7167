"""Getting the model out: `jobs.download_model` (the exported model directory, every file,
with progress), the whole-checkpoint download, and their CLI commands; internal markers
(`_COMPLETE`) never reach the user."""

from __future__ import annotations

import asyncio

import pytest

from humanline_client import AsyncClient, HumanlineError
from humanline_client.resources.jobs import FileDownload

from .conftest import MODEL_FILES


@pytest.fixture
def done_job(client, train_file, driver):
    job = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    driver.run(job.id, steps=2)
    return client.jobs.retrieve(job.id)


def _tree(root) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_download_model_writes_every_file_with_progress(client, done_job, tmp_path):
    assert sorted(done_job.model_files) == sorted(MODEL_FILES)  # the marker is not listed
    seen: list[FileDownload] = []
    dest = client.jobs.download_model(done_job.id, tmp_path / "model", progress=seen.append)
    assert dest == tmp_path / "model" and _tree(dest) == MODEL_FILES
    assert [(s.index, s.count) for s in seen] == [(1, 3), (2, 3), (3, 3)]
    assert {s.name: s.bytes for s in seen} == {k: len(v) for k, v in MODEL_FILES.items()}
    assert seen[0].line().startswith("[1/3] ")
    again = client.jobs.download_model(done_job.id, str(tmp_path / "model"), progress=False)
    assert _tree(again) == MODEL_FILES  # idempotent, no .part files left


def test_download_model_async(aclient_args, done_job, tmp_path):
    async def go():
        async with AsyncClient(**aclient_args) as client:
            return await client.jobs.download_model(done_job.id, tmp_path / "m", progress=False)

    assert _tree(asyncio.run(go())) == MODEL_FILES


def test_no_model_yet_or_a_path_outside_the_directory(client, train_file, driver, tmp_path):
    queued = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    with pytest.raises(HumanlineError, match="no exported model .status queued"):
        client.jobs.download_model(queued.id, tmp_path / "m")
    evil = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    driver.start(evil.id)
    model = driver.export_model(evil.id, {"ok.json": b"{}"})
    driver.finish(evil.id, final_model={**model, "files": ["ok.json", "../escape.txt"]})
    with pytest.raises(HumanlineError, match="outside"):
        client.jobs.download_model(evil.id, tmp_path / "m2", progress=False)
    assert not (tmp_path / "escape.txt").exists()


def test_whole_checkpoint_download(client, train_file, driver, server, tmp_path):
    job = client.jobs.create(base_model="tiny-llama", training_file=train_file, objective="dpo")
    driver.start(job.id)
    files = {"weights.safetensors": b"w" * 5, "optim/state.pt": b"o", "_COMPLETE": b"{}"}
    driver.checkpoint(job.id, 2, files)
    dest = client.jobs.download_checkpoint(job.id, step=2, to=tmp_path / "ckpt", progress=False)
    assert _tree(dest) == {k: v for k, v in files.items() if k != "_COMPLETE"}
    with pytest.raises(HumanlineError, match=r"no checkpoint at step 3 \(steps: 2\)"):
        client.jobs.download_checkpoint(job.id, step=3, to=tmp_path / "x")
    with pytest.raises(ValueError, match="to=DIR"):
        client.jobs.download_checkpoint(job.id, step=2)
    server.store.presign_jobs.add(job.id)  # through presigned redirects, as on S3
    dest = client.jobs.download_checkpoint(job.id, step=2, to=tmp_path / "s3", progress=False)
    assert _tree(dest) == {k: v for k, v in files.items() if k != "_COMPLETE"}


def test_cli_download_model_show_and_checkpoint(cli, done_job, tmp_path):
    shown = cli("jobs", "show", done_job.id).stdout
    assert f"humanline jobs download-model {done_job.id}" in shown and "3 files" in shown
    got = cli("jobs", "download-model", done_job.id, "-o", str(tmp_path / "model"))
    assert _tree(tmp_path / "model") == MODEL_FILES
    assert "[1/3]" in got.stderr and "[3/3]" in got.stderr and "wrote" in got.stderr
    ckpt = cli("jobs", "download", done_job.id, "--step", "2", "-o", str(tmp_path / "c"))
    assert _tree(tmp_path / "c") == {"adapter_model.safetensors": b"weights" * 10}
    assert "[1/1] adapter_model.safetensors" in ckpt.stderr
    listed = cli("jobs", "checkpoints", done_job.id).stdout
    assert "_COMPLETE" not in listed
