"""Format 2 checkpoints (torch.distributed.checkpoint, trainer.checkpoint): committed by a
`_COMPLETE` manifest written last, only committed ones listed or resumed, under a local root
or an fsspec URL (memory://, and the SeaweedFS S3 the tests start), format 1 dirs still
resume, and an evaluation reads a checkpoint's trainable weights on one process.

The 2-process cases (another world size, the sharded export) are in test_fsdp.py; HSDP in
test_hsdp.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from trainer import checkpoint
from trainer.checkpoint import read_weights
from trainer.train import Trainer, train

LORA = {"kind": "lora", "r": 4, "alpha": 8}


def _spec(make_spec, **kw):
    base = dict(
        variant="offline+humanline",
        max_steps=4,
        checkpoint_every=2,
        optim={"lr": 3e-3, "warmup_ratio": 0.0},
        quality_sample=0,
    )
    return make_spec(**{**base, **kw})


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_is_dcp_committed_last_and_torn_ones_are_never_resumed(tmp_path, make_spec):
    spec = _spec(make_spec, adapter=LORA)
    whole = tmp_path / "whole"
    train(spec, whole, progress=False)
    step2 = whole / "checkpoints" / "step-2"
    names = {p.name for p in step2.iterdir()}
    assert {".metadata", "__0_0.distcp", "rank-0.pt", "scheduler.pt", "data.pt"} <= names
    assert {"state.json", "spec.json", "_COMPLETE"} <= names and "weights.safetensors" not in names
    manifest = json.loads((step2 / "_COMPLETE").read_text())
    assert manifest["version"] == 1
    assert {f["path"]: f["size"] for f in manifest["files"]} == {
        p.name: p.stat().st_size for p in step2.iterdir() if p.name != "_COMPLETE"
    }
    for f in step2.iterdir():  # no server path (DCP's metadata records one by default)
        assert tmp_path.name.encode() not in f.read_bytes(), f.name
    state = json.loads((step2 / "state.json").read_text())
    assert (state["format"], state["world_size"], state["global_sample"]) == (2, 1, 8)
    # the adapter only, under peft's names (what weights.safetensors held)
    assert all("lora_" in k for k in read_weights(step2))

    # step 4 written but not committed (a crash before the marker): resume from step 2
    part = tmp_path / "part"
    shutil.copytree(whole / "checkpoints", part / "checkpoints")
    (part / "checkpoints" / "step-4" / "_COMPLETE").unlink()
    assert checkpoint.latest(part / "checkpoints").step == 2
    (part / "checkpoints" / "step-4" / "state.json").write_text("torn")  # never read
    train(spec, part, resume=True, progress=False)
    resumed = [json.loads(ln) for ln in (part / "events.jsonl").read_text().splitlines()]
    assert [e["data"]["step"] for e in resumed if e["kind"] == "resumed"] == [2]
    assert _equal(
        read_weights(whole / "checkpoints/step-4"), read_weights(part / "checkpoints/step-4")
    )


def test_a_url_root_resumes_bitwise_and_the_export_is_published(tmp_path, make_spec):
    """An fsspec root (memory:// here; s3:// below): save, list, resume, read back; the
    export is written locally and published to its URL with a `_COMPLETE` manifest."""
    import fsspec

    spec = _spec(make_spec)
    root = f"memory://ckpt-{tmp_path.name}"
    train(spec, tmp_path / "whole", progress=False, checkpoints=f"{root}/whole")
    assert not (tmp_path / "whole" / "checkpoints").exists()
    assert checkpoint.latest(f"{root}/whole").step == 4
    fs = fsspec.filesystem("memory")
    base = f"/ckpt-{tmp_path.name}"
    fs.copy(f"{base}/whole/step-2", f"{base}/part/step-2", recursive=True)
    result = train(
        spec,
        tmp_path / "part",
        resume=True,
        progress=False,
        checkpoints=f"{root}/part",
        final=f"{root}/final",
    )
    assert _equal(read_weights(f"{root}/whole/step-4"), read_weights(f"{root}/part/step-4"))
    assert result.final_dir == f"{root}/final"
    manifest = json.loads(fs.cat(f"{base}/final/_COMPLETE"))
    local = tmp_path / "part" / "final"
    assert {f["path"]: f["size"] for f in manifest["files"]} == {
        p.name: p.stat().st_size for p in local.iterdir()
    }
    assert fs.cat(f"{base}/final/model.safetensors") == (local / "model.safetensors").read_bytes()


def test_s3_root_ignores_an_uncommitted_checkpoint(tmp_path, make_spec, s3_server, monkeypatch):
    """Every rank writes straight to S3 (s3fs); a step whose marker never came is not listed
    and the run resumes from the one before, bit for bit."""
    bucket = s3_server.new_bucket("dcp")
    for key, value in {
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
        "AWS_ENDPOINT_URL_S3": s3_server.endpoint_url,
        "AWS_DEFAULT_REGION": s3_server.region,
    }.items():
        monkeypatch.setenv(key, value)
    spec = _spec(make_spec, adapter=LORA)
    root = f"s3://{bucket}/team/job"
    train(spec, tmp_path / "whole", progress=False, checkpoints=root)
    client = s3_server.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert "team/job/step-4/_COMPLETE" in keys and "team/job/step-4/.metadata" in keys
    final4 = read_weights(f"{root}/step-4")
    client.delete_object(Bucket=bucket, Key="team/job/step-4/_COMPLETE")  # died before commit
    import fsspec

    fsspec.filesystem("s3").invalidate_cache()
    assert checkpoint.latest(root).step == 2
    train(spec, tmp_path / "part", resume=True, progress=False, checkpoints=root)
    assert checkpoint.latest(root).step == 4
    assert _equal(final4, read_weights(f"{root}/step-4"))


def _write_v1(trainer: Trainer, directory: Path, step: int) -> None:
    """A format 1 checkpoint as the trainer wrote it before DCP (one process, DDP), with the
    `_COMPLETE` a resume's download leaves beside it."""
    from trainer.modeling import trainable_state_dict

    directory.mkdir(parents=True)
    weights = trainable_state_dict(trainer.unwrapped)
    save_file({k: v.contiguous() for k, v in weights.items()}, directory / "weights.safetensors")
    torch.save(trainer.optimizer.state_dict(), directory / "optimizer.pt")
    torch.save(trainer.scheduler.state_dict(), directory / "scheduler.pt")
    rank = {
        "rng": checkpoint.rng_state(),
        "reference": trainer.reference.state_dict(),
        "data": trainer.data.state_dict(),
    }
    torch.save(rank, directory / "rank-0.pt")
    (directory / "spec.json").write_text(trainer.spec.model_dump_json())
    state = {"step": step, "world_size": 1, "parallelism": "ddp", "grad_accum": 1}
    (directory / "state.json").write_text(json.dumps(state))
    checkpoint.commit(directory)


def test_a_format_1_checkpoint_still_resumes_and_reads(tmp_path, make_spec):
    spec = _spec(make_spec, checkpoint_every=0)
    train(spec, tmp_path / "whole", progress=False)
    old = Trainer(spec, tmp_path / "old", progress=False)
    old.step(1)
    old.step(2)
    _write_v1(old, tmp_path / "old" / "checkpoints" / "step-2", 2)
    from trainer.modeling import trainable_state_dict

    at2 = read_weights(tmp_path / "old" / "checkpoints" / "step-2")  # format 1 reads too
    assert _equal(at2, trainable_state_dict(old.unwrapped))
    old.data.close()
    train(spec, tmp_path / "old", resume=True, progress=False)
    assert _equal(
        read_weights(tmp_path / "whole" / "checkpoints/step-4"),
        read_weights(tmp_path / "old" / "checkpoints/step-4"),
    )


def test_an_evaluation_loads_a_dcp_checkpoint(tmp_path, make_spec):
    from trainer.evaluation.generation import load_model

    spec = _spec(make_spec, adapter=LORA, max_steps=2)
    train(spec, tmp_path / "run", progress=False)
    ckpt = tmp_path / "run" / "checkpoints" / "step-2"
    model, _, _ = load_model({"type": "checkpoint", "path": str(ckpt)}, device="cpu")
    trained = read_weights(ckpt)
    assert any(k.endswith("lora_B.weight") and v.abs().max() > 0 for k, v in trained.items())
    source = {"type": "dir", "path": str(tmp_path / "run" / "final"), "base_model": "tiny-llama"}
    final = load_model(source, device="cpu")[0]
    merged, exported = model.state_dict(), final.state_dict()
    assert all(torch.allclose(merged[k], exported[k]) for k in exported)


def test_a_resume_with_another_batch_is_refused_at_the_global_sample_index(tmp_path, make_spec):
    """The data position is a global sample index (step x examples per batch): a resume whose
    batch would put the same step at another sample is refused, naming the position."""
    spec = _spec(make_spec, max_steps=2)
    train(spec, tmp_path / "run", progress=False)
    other = spec.model_copy(update={"batch_size": 8, "max_steps": 4})
    with pytest.raises(ValueError, match="global sample 8"):
        train(other, tmp_path / "run", resume=True, progress=False)
