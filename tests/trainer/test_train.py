"""End-to-end training on the tiny model: loss falls, resume is exact, outputs are complete."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.checkpoint import read_weights
from trainer.train import train

REPO = Path(__file__).resolve().parents[2]


def metrics(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def weights(out: Path, step: int) -> dict:
    return read_weights(out / "checkpoints" / f"step-{step}")


@pytest.mark.parametrize("objective", ["dpo", "kto", "grpo"])
@pytest.mark.parametrize("variant", ["offline", "offline+humanline"])
def test_loss_falls(tmp_path, make_spec, unpaired_file, objective, variant):
    extra = {"training_file": str(unpaired_file)} if objective == "kto" else {}
    # 8 pairs, 8 examples, 8 groups of two: GRPO's batch_size counts sequences (paper's units)
    spec = make_spec(
        objective=objective,
        variant=variant,
        max_steps=12,
        batch_size=16 if objective == "grpo" else 8,
        optim={"lr": 3e-3, "warmup_ratio": 0.0},
        **extra,
    )
    result = train(spec, tmp_path, progress=False)
    assert result.status == "succeeded" and result.step == 12
    rows = metrics(tmp_path)
    first, last = rows[0]["loss"], sum(r["loss"] for r in rows[-3:]) / 3
    # Humanline k=1 scores each step against the previous policy, so its loss can only fall
    # by what one step gains; require a clear, not a large, drop.
    assert last < 0.97 * first, (first, [r["loss"] for r in rows])
    assert {"loss", "grad_norm", "lr", "tokens_per_s", "clamp_frac", "sync_time"} <= set(rows[0])
    assert (tmp_path / "final").is_dir()
    quality = json.loads((tmp_path / "data_quality.json").read_text())
    assert (
        quality["n"] > 0
        and quality["quantiles"]["min"] <= quality["mean"] <= quality["quantiles"]["max"]
    )
    kinds = [json.loads(ln)["kind"] for ln in (tmp_path / "events.jsonl").read_text().splitlines()]
    kinds = [k for k in kinds if k != "progress"]  # tests/trainer/test_export.py checks those
    assert kinds[0] == "data" and "started" in kinds and kinds[-1] == "finished"


def test_clamp_fraction_is_reported(tmp_path, make_spec):
    """A narrow clip range (|log-ratio| ≤ 0.01) with k=3 must clamp some tokens, and say so."""
    spec = make_spec(
        variant="offline+humanline",
        max_steps=6,
        optim={"lr": 1e-2, "warmup_ratio": 0.0},
        humanline_params={"log_eps_P": -0.01, "log_eps_R": 0.01, "sync_every": 3},
    )
    train(spec, tmp_path, progress=False)
    fractions = [r["clamp_frac"] for r in metrics(tmp_path)]
    assert fractions[0] == 0.0  # step 1: policy == reference
    assert max(fractions) > 0.05, fractions


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("variant", ["offline", "offline+humanline"])
def test_resume_is_bitwise_identical(tmp_path, make_spec, lora, variant):
    adapter = {"kind": "lora", "r": 4, "alpha": 8} if lora else {"kind": "none"}
    spec = make_spec(
        variant=variant,
        max_steps=6,
        checkpoint_every=2,
        adapter=adapter,
        humanline_params={"sync_every": 3},
    )
    full = tmp_path / "full"
    train(spec, full, progress=False)

    part = tmp_path / "part"
    (part).mkdir()
    (part / "STOP").touch()  # stop after step 1's... the first step boundary
    first = train(spec, part, progress=False)
    assert first.status == "stopped" and first.step == 1
    (part / "STOP").unlink()
    # torn checkpoints (a crash mid-write: no _COMPLETE marker) must be ignored on resume
    (part / "checkpoints" / "step-99.tmp").mkdir()
    shutil.copytree(part / "checkpoints" / "step-1", part / "checkpoints" / "step-5")
    (part / "checkpoints" / "step-5" / "_COMPLETE").unlink()
    second = train(spec, part, resume=True, progress=False)
    assert second.status == "succeeded" and second.step == 6
    a, b = weights(full, 6), weights(part, 6)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert [r["step"] for r in metrics(part)] == list(range(1, 7))


def test_cli_runs_a_spec_and_rejects_a_bad_one(tmp_path, pref_file):
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"base_model: tiny-llama\ntraining_file: {pref_file}\nobjective: dpo\n"
        "variant: offline+humanline\n"
        "batch_size: 4\nmax_steps: 2\nmax_length: 96\nmax_prompt_length: 48\nquality_sample: 0\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-m", "trainer", "run", str(spec), "--out", str(tmp_path / "o"),
         "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1])["status"] == "succeeded"
    spec.write_text(spec.read_text().replace("objective: dpo", "objective: ppo"))
    bad = subprocess.run(
        [sys.executable, "-m", "trainer", "run", str(spec), "--out", str(tmp_path / "o2")],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert bad.returncode == 2 and "objective" in bad.stderr


@pytest.mark.parametrize("precision, mixed", [("bf16", "bf16"), ("fp16", "no"), ("fp32", "no")])
def test_cpu_autocasts_bf16_and_refuses_fp16_with_a_warning(tmp_path, make_spec, precision, mixed):
    from trainer.train import Trainer

    trainer = Trainer(make_spec(precision=precision, quality_sample=0), tmp_path, progress=False)
    assert trainer.accelerator.mixed_precision == mixed
    events = (tmp_path / "events.jsonl").read_text()
    assert ("precision fp16 needs a GPU" in events) == (precision == "fp16")
    assert trainer.step(1)["loss"] > 0  # and a step runs in that precision
