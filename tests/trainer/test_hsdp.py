"""HSDP (parallelism.hsdp: shard within a node, replicate across nodes) on a 2-D mesh
(trainer.distributed.Sharded): with 2 gloo CPU processes, a (1, 2) and a (2, 1) mesh train
exactly as plain FSDP does, and an HSDP checkpoint (DCP) loads into plain FSDP."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_hsdp_meshes_train_like_fsdp_and_their_checkpoint_loads_into_fsdp(tmp_path):
    probe = REPO / "tests" / "trainer" / "hsdp_probe.py"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [*argv, str(probe), str(tmp_path / "ckpt")],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (result["hsdp_1x2_mesh"], result["hsdp_2x1_mesh"]) == ([1, 2], [2, 1])
    assert result["fsdp"][0] != result["fsdp"][-1]  # it trained
    for mesh in ("hsdp_1x2", "hsdp_2x1"):
        assert result[mesh] == pytest.approx(result["fsdp"], rel=1e-5), mesh
    assert result["reloaded"] <= 1e-7
