"""benchmarks/gpu_smoke.py's CPU self-check: every part of the GPU proof runs on tiny shapes,
so the script that is meant for a GPU machine is known to work before one is lent. Its figures
mean nothing here; what is checked is that every part ran (or was skipped with a reason) and
that the last line is the JSON summary with each figure and its target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_smoke  # noqa: E402 - benchmarks/ is on sys.path only from the line above

PARTS = ("bf16", "overhead", "layout", "fsdp", "online", "trl", "mfu", "scale", "service", "vllm")


def test_self_check_runs_every_part(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HUMANLINE_CACHE": os.environ.get("HUMANLINE_CACHE", str(Path.home() / ".cache/humanline")),
        "OMP_NUM_THREADS": "1",
        "PYTHON": sys.executable,  # the shell script's interpreter (python3 on a GPU machine)
    }
    out = subprocess.run(
        ["bash", str(REPO / "benchmarks/gpu_smoke.sh"), "--self-check", "--work", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.stdout.strip(), out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["mode"] == "self-check" and summary["errors"] == {}, out.stdout[-3000:]
    assert out.returncode == 0 and summary["ok"] is True
    figures = summary["figures"]
    for part in PARTS:  # every part left a figure or a reason
        assert any(name.startswith(part) for name in figures) or part in summary["skipped"], part
    assert figures["bf16.full.loss_finite"] == {
        "value": True, "target": "true", "met": True, "enforced": True,
    }  # fmt: skip
    assert figures["online_grpo.hf.succeeded"]["met"] is True
    # the product end to end (SDK -> API -> worker -> trainer, evaluations): a CPU worker here
    for name, value in (
        ("service.job_status", "succeeded"),
        ("service.trained_on", "cpu"),
        ("service.eval_math.generated_on", "cpu"),
        ("service.eval_instruction.generated_on", "cpu"),
    ):
        assert figures[name]["value"] == value and figures[name]["enforced"] is True, name
    assert figures["service.checkpoint_steps"]["met"] is True
    speed = (
        "overhead.full.humanline_over_offline",
        "trl.ours_over_trl",
        "layout.b2.one_pass_over_shared",  # self-check batch 2 (and 8)
    )
    for name in speed:
        assert figures[name]["target"] in ("<= 1.05", "<= 0.6", "<= 1.0")
        assert figures[name]["enforced"] is False  # speed targets are for the GPU run
        assert figures[name]["value"] > 0
    assert figures["mfu.tokens_per_s"]["value"] > 0
    for run in ("1b.s256", "1b.s256.ckpt", "1b.s2560", "8b.lora"):  # gpu_scale.py, tiny here
        assert figures[f"scale.{run}.tokens_per_s"]["value"] > 0
        assert figures[f"scale.{run}.micro_batch_pairs"]["value"] >= 1
        assert 0.5 < figures[f"scale.{run}.estimate_over_measured"]["value"] < 2  # RSS here
    assert figures["scale.1b.s256.mfu"]["target"] == ">= 0.40"
    assert figures["scale.1b.s256.gpu_busy"]["enforced"] is False
    for change in ("chunked_logps", "keep_softmax"):  # item 4's A/B, in the 1b.s256 process
        assert figures[f"scale.1b.s256.ab.{change}.step_time_on_over_off"]["value"] > 0
    for adapter in ("full", "lora"):  # reported, no target
        assert figures[f"overhead.{adapter}.model_walk_over_scoped"]["value"] > 0
        assert figures[f"overhead.{adapter}.per_use_copies_over_one_copy"]["value"] > 0
    assert "vllm" in summary["skipped"]


def test_gpu_targets_are_enforced_and_errors_fail_the_run():
    gpu = gpu_smoke.Report(gpu=True)
    gpu.figure("overhead.full.humanline_over_offline", 1.2, "<= 1.05", False, gpu_only=True)
    assert gpu.unmet() == ["overhead.full.humanline_over_offline"] and not gpu.ok()
    cpu = gpu_smoke.Report(gpu=False)
    cpu.figure("overhead.full.humanline_over_offline", 1.2, "<= 1.05", False, gpu_only=True)
    cpu.figure("bf16.full.loss_finite", True, "true", True)
    assert cpu.ok()
    cpu.figure("bf16.lora.loss_finite", False, "true", False)
    assert cpu.unmet() == ["bf16.lora.loss_finite"]

    def broken(report):
        raise RuntimeError("CUDA error: out of memory")

    r = gpu_smoke.Report(gpu=True)
    r.part("mfu", broken)  # recorded, and the next part still runs
    r.part("fsdp", lambda report: "no parallelism option")
    assert r.errors == {"mfu": "RuntimeError: CUDA error: out of memory"}
    assert r.skipped == {"fsdp": "no parallelism option"} and not r.ok()


def test_model_shapes_are_the_named_ones():
    """SmolLM2-135M and Llama-3.2-1B shapes: parameter counts from the configs alone."""

    def params(shape):
        v, h, i, n = (shape[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                          "num_hidden_layers"))  # fmt: skip
        kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
        per_layer = h * h * 2 + h * kv * 2 + 3 * h * i + 2 * h
        return v * h + n * per_layer + h  # tied embeddings

    assert round(params(gpu_smoke.SMOLLM2_SHAPE) / 1e6, 1) == 134.5
    assert round(params(gpu_smoke.ONE_B_SHAPE) / 1e9, 2) == 1.24


def test_parts_past_the_time_budget_are_reported_not_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(
        "HUMANLINE_CACHE", os.environ.get("HUMANLINE_CACHE", str(Path.home() / ".cache/humanline"))
    )
    code = gpu_smoke.main(
        ["--self-check", "--parts", "mfu", "--budget-s", "0", "--work", str(tmp_path)]
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 1 and summary["ok"] is False
    assert summary["errors"] == {"mfu": "not run: the time budget of 0 s was spent before it"}
