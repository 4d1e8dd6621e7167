"""Format 1 checkpoints (written before trainer.checkpoint moved to DCP): `weights.safetensors`
(the trainable weights, gathered), `optimizer.pt` (DDP) or `optimizer-rank-R.pt` (FSDP, one
shard per rank), `scheduler.pt`, `rank-R.pt` ({rng, reference, data}), `state.json` without a
"format". They resume at the world size and parallelism they were written with (their
optimizer state is laid out per rank); anything else is refused with a clear message."""

from __future__ import annotations

from pathlib import Path

from trainer import ckptio
from trainer.ckptstate import Checkpoint, load_state, set_rng_state


def load_v1(
    ckpt: Checkpoint,
    state: dict,
    accelerator,
    *,
    parallel,
    model,
    optimizer,
    scheduler,
    reference,
    data,
) -> dict:
    """A format 1 checkpoint (written before DCP): same world size and parallelism only (its
    optimizer state is laid out per rank)."""
    from safetensors.torch import load_file

    from contract.runs import CHECKPOINT_WEIGHTS_FILE

    if ckptio.is_url(ckpt.path):
        raise ValueError(f"format 1 checkpoint {ckpt.path} resumes from a local directory only")
    path = Path(ckpt.path)
    if state["world_size"] != accelerator.num_processes:
        raise ValueError(
            f"checkpoint {path} (format 1) was written by {state['world_size']} processes; "
            f"resume with the same number (got {accelerator.num_processes})"
        )
    if state.get("parallelism", "ddp") != parallel.name:  # their optimizer layouts differ
        raise ValueError(
            f"checkpoint {path} (format 1) was written with parallelism "
            f"{state.get('parallelism', 'ddp')!r}; resume with the same (got {parallel.name!r})"
        )
    parallel.load_trainable_state(model, load_file(path / CHECKPOINT_WEIGHTS_FILE))
    parallel.load_optimizer(optimizer, path)
    scheduler.load_state_dict(load_state(path / "scheduler.pt"))
    mine = load_state(path / f"rank-{accelerator.process_index}.pt")
    reference.load_state_dict(mine["reference"])
    data.load_state_dict(mine["data"])
    set_rng_state(mine["rng"])
    return state
