"""Issue 26's CPU benchmark: sharded DCP checkpoints against the gathered save they replace,
and two nodes against one on loopback. Ratios measured side by side in one run.

  save      SmolLM2-135M's shape (random weights), FSDP over 2 CPU processes (gloo), one AdamW
            step taken. In the same processes, interleaved, medians over the rounds:
              dcp       what trainer.checkpoint writes now: every rank its own shards
                        (Parallel.checkpoint_state + torch.distributed.checkpoint.save)
              gathered  what it wrote before (format 1): every weight gathered whole on rank
                        0 and written to one safetensors file, each rank's optimizer shard
            figures: dcp time / gathered time (target <= 1.0), and rank 0's peak RSS during
            the DCP save / its peak while training (<= 1.1; VmHWM, reset before each save)
  nodes     the trainer itself (`python -m trainer run`, tiny-llama, DPO), started by torchrun
            agents as a TrainJob starts them (PET_*, static rendezvous): 2 nodes x 1 process
            vs 1 node x 2 processes, median step time from rank 0's metrics (first step
            dropped); figure: their ratio (target <= 1.2)

    python benchmarks/multinode.py              # full: SmolLM2's shape, 3 rounds, 16 steps
    python benchmarks/multinode.py --quick      # under a minute: 12 of SmolLM2's 30 layers
    python benchmarks/multinode.py --self-check # a tiny shape, seconds: the logic only

The last line printed is one JSON object with each figure and its target; exit 0 only when
every target is met (--self-check: when every part ran; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

TARGETS = {"save_time_ratio": 1.0, "save_peak_rss_ratio": 1.1, "two_nodes_step_ratio": 1.2}
MODES = {  # layers of SmolLM2's shape, save rounds, training steps
    "full": (None, 3, 16),
    "quick": (12, 2, 8),
    "self-check": (2, 1, 4),
}


# ---- part 1: one torchrun rank (`--rank-save`) ----------------------------------------------


def rank_save(out: Path, layers: int | None, rounds: int) -> None:
    import shutil
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from accelerate import Accelerator
    from procfs import reset_peak, status_kb
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from contract.memory import BUILTIN_SHAPES
    from contract.shapes import SMOLLM2
    from trainer import ckptio
    from trainer.distributed import Sharded
    from trainer.dtensors import _full, _local, _unique_keys

    config = BUILTIN_SHAPES[SMOLLM2].llama_config()
    if layers is not None:
        config["num_hidden_layers"] = layers
    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    parallel = Sharded(acc, SimpleNamespace(strategy="fsdp", reshard_after_forward=True))
    model = parallel.wrap(LlamaForCausalLM(LlamaConfig(**config)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1000, (2, 64))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    train_peak = status_kb("VmHWM")
    rank = dist.get_rank()

    def dcp_save(path: Path) -> None:
        dcp.save(
            parallel.checkpoint_state(model, optimizer), storage_writer=ckptio.storage_writer(path)
        )

    def gathered_save(path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        params, full = model.state_dict(keep_vars=True), {}
        for key in _unique_keys(model):
            tensor = _full(params[key].detach())
            if rank == 0:
                full[key] = tensor.to("cpu", copy=True).contiguous()
        if rank == 0:
            save_file(full, path / "weights.safetensors")
        state = optimizer.state_dict()
        state["state"] = {
            i: {k: _local(v).cpu() for k, v in s.items()} for i, s in state["state"].items()
        }
        torch.save(state, path / f"optimizer-rank-{rank}.pt")
        del full

    times: dict[str, list[float]] = {"dcp": [], "gathered": []}
    peaks: dict[str, list[int]] = {"dcp": [], "gathered": []}
    for r in range(rounds):
        for name, save in (("dcp", dcp_save), ("gathered", gathered_save)):
            path = out / f"{name}-{r}"
            dist.barrier()
            reset_peak()
            t0 = time.perf_counter()
            save(path)
            dist.barrier()
            times[name].append(time.perf_counter() - t0)
            peaks[name].append(status_kb("VmHWM"))
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
    if rank == 0:
        print(json.dumps({"train_peak_kb": train_peak, "times": times, "peaks_kb": peaks}))
    dist.destroy_process_group()


def save_part(layers: int | None, rounds: int, work: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
            "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
            str(_port()), __file__, "--rank-save", str(work), "--layers", str(layers or 0),
            "--rounds", str(rounds)]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    dcp_s, gathered_s = (statistics.median(raw["times"][k]) for k in ("dcp", "gathered"))
    return {
        "dcp_save_s": round(dcp_s, 3),
        "gathered_save_s": round(gathered_s, 3),
        "save_time_ratio": round(dcp_s / gathered_s, 3),
        "save_peak_rss_ratio": round(max(raw["peaks_kb"]["dcp"]) / raw["train_peak_kb"], 3),
        "gathered_peak_rss_ratio": round(
            max(raw["peaks_kb"]["gathered"]) / raw["train_peak_kb"], 3
        ),
    }


# ---- part 2: two nodes vs one, the trainer as a TrainJob starts it ---------------------------


def _port() -> int:
    from worker.launch import free_port

    return free_port()


def run_trainer(spec: Path, work: Path, nodes: int, nproc: int) -> float:
    """Median step time (s) of rank 0, first step dropped."""
    port, procs = _port(), []
    for node in range(nodes):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
               "PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(nproc),
               "PET_NODE_RANK": str(node), "PET_MASTER_ADDR": "127.0.0.1",
               "PET_MASTER_PORT": str(port), "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
        out = work / f"{nodes}x{nproc}-node{node}"
        argv = [sys.executable, "-m", "torch.distributed.run", "-m", "trainer", "run",
                str(spec), "--out", str(out), "--no-progress"]  # fmt: skip
        procs.append(subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))  # fmt: skip
    for p in procs:
        _, err = p.communicate(timeout=900)
        if p.returncode != 0:
            raise RuntimeError(err[-3000:])
    lines = (work / f"{nodes}x{nproc}-node0" / "metrics.jsonl").read_text().splitlines()
    stamps = [json.loads(ln)["time"] for ln in lines]
    return statistics.median(b - a for a, b in zip(stamps[1:], stamps[2:], strict=False))


def nodes_part(steps: int, work: Path) -> dict:
    from trainer.synthetic import preference_records, write_jsonl

    data = write_jsonl(work / "pref.jsonl", preference_records(64, seed=1))
    spec = {"base_model": "tiny-llama", "training_file": str(data), "objective": "dpo",
            "batch_size": 8, "max_steps": steps, "max_length": 128, "max_prompt_length": 64,
            "optim": {"lr": 1e-4, "warmup_ratio": 0.0}, "quality_sample": 4}  # fmt: skip
    path = work / "spec.json"
    path.write_text(json.dumps(spec))
    one_node = run_trainer(path, work, 1, 2)
    two_nodes = run_trainer(path, work, 2, 1)
    return {
        "one_node_step_s": round(one_node, 4),
        "two_nodes_step_s": round(two_nodes, 4),
        "two_nodes_step_ratio": round(two_nodes / one_node, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--self-check", action="store_true")
    ap.add_argument("--rank-save", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_save is not None:
        rank_save(args.rank_save, args.layers or None, args.rounds)
        return 0
    mode = "self-check" if args.self_check else "quick" if args.quick else "full"
    layers, rounds, steps = MODES[mode]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="multinode-") as tmp:
        work = Path(tmp)
        figures = {**save_part(layers, rounds, work / "save"), **nodes_part(steps, work)}
    met = {k: figures[k] <= target for k, target in TARGETS.items()}
    result = {
        "benchmark": "multinode",
        "mode": mode,
        **figures,
        "targets": {k: f"<= {v}" for k, v in TARGETS.items()},
        "met": met,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(result))
    return 0 if mode == "self-check" or all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
