"""Run by test_hsdp.py under `torchrun --nproc_per_node 2` (gloo, CPU): a few AdamW steps of
tiny-llama on fixed random tokens, sharded as plain FSDP (one mesh of 2), as HSDP on a (1, 2)
mesh and as HSDP on a (2, 1) mesh (trainer.distributed.Sharded); rank 0 prints the losses of
each as one JSON line. The HSDP run then checkpoints (DCP, trainer.distributed's
checkpoint_state) and a plain FSDP model loads it: printed as `reloaded` (max abs difference).
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
from accelerate import Accelerator

from contract.spec import JobSpec
from trainer.distributed import Sharded
from trainer.dtensors import _full
from trainer.modeling import load_policy, resolve_model

STEPS = 3


def build(config, acc):
    spec = JobSpec(base_model="tiny-llama", training_file="x", objective="sft", precision="fp32")
    torch.manual_seed(0)
    par = Sharded(acc, config)
    model = par.wrap(load_policy(spec, resolve_model("tiny-llama")))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    return par, model, optimizer


def train(config, acc) -> tuple[list[float], tuple]:
    par, model, optimizer = build(config, acc)
    losses = []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(1000 * step + dist.get_rank())
        ids = torch.randint(0, 100, (2, 16), generator=gen)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
    return losses, (par, model, optimizer)


def main(out: str) -> None:
    import torch.distributed.checkpoint as dcp

    acc = Accelerator(cpu=True)
    fsdp = SimpleNamespace(strategy="fsdp", reshard_after_forward=True, hsdp=False, nodes=1)
    result = {}
    for name, config in {
        "fsdp": fsdp,
        "hsdp_1x2": SimpleNamespace(**{**vars(fsdp), "hsdp": True, "nodes": 1}),
        "hsdp_2x1": SimpleNamespace(**{**vars(fsdp), "hsdp": True, "nodes": 2}),
    }.items():
        result[name], (par, model, optimizer) = train(config, acc)
        result[f"{name}_mesh"] = list(par.mesh.shape)
    # the last (HSDP 2x1) checkpointed, loaded into plain FSDP
    dcp.save(par.checkpoint_state(model, optimizer), checkpoint_id=out)
    other, loaded, opt2 = build(fsdp, acc)
    state = other.checkpoint_state(loaded, opt2)
    dcp.load(state, checkpoint_id=out)
    other.load_checkpoint_state(loaded, opt2, state)
    a, b = model.state_dict(), loaded.state_dict()
    result["reloaded"] = max((_full(a[k]) - _full(b[k])).abs().max().item() for k in a)
    if dist.get_rank() == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
