"""Checkpoints that resume bit-for-bit: trainable weights, optimizer, scheduler, RNG streams,
the reference's pending log-probs, the data position and the online round's examples, and the
spec.

Format 2 (this one): `ROOT/step-N/` under a checkpoint root that is a local directory
(`OUT/checkpoints`, the default) or an fsspec URL (trainer.ckptio), holding

    .metadata, __R_0.distcp   torch.distributed.checkpoint (DCP) of {"model", "optim"}: every
                              rank writes its own shards (get_state_dict: no rank gathers the
                              model), the weights keyed as trainable_state_dict names them
    rank-R.pt                 rank R's RNG streams (torch, cuda, python, numpy) and the
                              reference's pending lookahead log-probs (keyed by row)
    scheduler.pt, data.pt     rank 0: the LR schedule; the data's state (online: the prompt
                              cursor and the round's examples; the same on every rank)
    state.json, spec.json     rank 0: format, step, world size, the data position as a global
                              sample index (step x examples per batch), the spec
    _COMPLETE                 written LAST by rank 0 after a barrier: the manifest
                              {"version": 1, "files": [{"path", "size"}]} (contract.runs)

`latest` lists only committed (marked) step dirs; a step dir without its marker (a crash
before the commit) is never resumed.

Another world size (DCP reshards the model and the optimizer; the rest is mapped):
* rank r restores rank r's RNG streams if the checkpoint has a rank r, else rank 0's (random
  draws of a run come from derive_seed streams named by step and rank, so these only matter to
  code outside them);
* pending lookahead log-probs are keyed by row (TokenSeq), so every rank loads every old
  rank's rows and finds its own; the others are dropped once their step has passed;
* the data: the plan is a function of the global step (trainer.plan: the global batch of a
  step does not depend on the world size), so the global sample index is the position; online
  data's state is global.

Format 1 (weights.safetensors, optimizer.pt or optimizer-rank-R.pt, rank-R.pt: no "format" in
state.json) still resumes at the same world size and parallelism, through `_load_v1`.

Every `.pt` file is read with `load_state` (torch.load's weights_only=True): tensors, plain
Python data and the few dataclasses of ours named in CHECKPOINT_TYPES (an online round's
examples), nothing else; DCP's `.metadata` goes through a restricted unpickler
(trainer.ckptio). A checkpoint crosses machines through the store; a pickle that could run
code on load is refused (UnsafeCheckpoint), never executed.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint._nested_dict import set_element

from contract.runs import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_SPEC_FILE,
    CHECKPOINT_STATE_FILE,
    CHECKPOINTS_DIR,
    COMPLETE_MARKER,
    MANIFEST_VERSION,
    checkpoint_dir_name,
    checkpoint_step,
)
from trainer import ckptio
from trainer.ckptio import Root
from trainer.ckptstate import (  # noqa: F401 (re-exported: the checkpoint's API)
    CHECKPOINT_TYPES,
    Checkpoint,
    UnsafeCheckpoint,
    load_state,
    rng_state,
    set_rng_state,
)


def checkpoint_dir(out_dir: Path) -> Path:
    """The default checkpoint root of a run directory."""
    return Path(out_dir) / CHECKPOINTS_DIR


def is_committed(path: Root) -> bool:
    return ckptio.exists(ckptio.join(path, COMPLETE_MARKER))


def latest(root: Root) -> Checkpoint | None:
    """The newest committed checkpoint under the checkpoint root `root`, if any."""
    found = []
    for name in ckptio.list_dirs(root):
        step = checkpoint_step(name)
        if step is not None and is_committed(ckptio.join(root, name)):
            found.append(Checkpoint(step, ckptio.join(root, name)))
    return max(found, key=lambda c: c.step, default=None)


def read_json(path: Root, name: str) -> dict:
    return json.loads(ckptio.read_bytes(ckptio.join(path, name)))


def _load_bytes(path: Root) -> Any:
    return load_state(path, io.BytesIO(ckptio.read_bytes(path)))


def _save_bytes(path: Root, obj: Any) -> None:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    ckptio.write_bytes(path, buffer.getvalue())


def save(
    root: Root,
    step: int,
    *,
    accelerator,
    parallel,
    model,
    optimizer,
    scheduler,
    reference,
    data,
    spec_json: str,
    extra: dict,
) -> Checkpoint:
    """Collective: every process calls it. Writes `root/step-N` and commits it."""
    import torch.distributed.checkpoint as dcp

    acc = accelerator
    path = ckptio.join(root, checkpoint_dir_name(step))
    if acc.is_main_process:  # an earlier attempt at this step: uncommit it, then remove it
        marker = ckptio.join(path, COMPLETE_MARKER)
        if ckptio.exists(marker):
            ckptio.remove_tree(marker)
        ckptio.remove_tree(path)
    acc.wait_for_everyone()
    with _as_asked():
        dcp.save(
            parallel.checkpoint_state(model, optimizer),
            storage_writer=ckptio.storage_writer(path),
            no_dist=_alone(),
        )
    rank = acc.process_index
    mine = {"rng": rng_state(), "reference": reference.state_dict()}
    _save_bytes(ckptio.join(path, f"rank-{rank}.pt"), mine)
    if acc.is_main_process:
        _save_bytes(ckptio.join(path, "scheduler.pt"), scheduler.state_dict())
        _save_bytes(ckptio.join(path, "data.pt"), data.state_dict())
        ckptio.write_bytes(ckptio.join(path, CHECKPOINT_SPEC_FILE), spec_json.encode())
        state = {
            "format": CHECKPOINT_FORMAT,
            "step": step,
            "world_size": acc.num_processes,
            "parallelism": parallel.name,
            **extra,
        }
        ckptio.write_bytes(ckptio.join(path, CHECKPOINT_STATE_FILE), json.dumps(state).encode())
    acc.wait_for_everyone()  # every rank's files are written: commit
    if acc.is_main_process:
        commit(path)
    acc.wait_for_everyone()
    return Checkpoint(step, path)


def global_sample(step: int, examples_per_batch: int) -> int:
    """The data position after `step`: examples trained on so far, counted over all ranks (a
    step's global batch does not depend on the world size, trainer.plan)."""
    return step * examples_per_batch


def check_position(state: dict, step: int, examples_per_batch: int) -> None:
    """A resume continues at the checkpoint's global sample index: the batch must not change."""
    saved = state.get("global_sample")
    if saved is not None and saved != global_sample(step, examples_per_batch):
        raise ValueError(
            f"the checkpoint at step {step} is at global sample {saved}, which a batch of "
            f"{examples_per_batch} examples does not reach at that step; resume with its batch"
        )


def _alone() -> bool:
    """No process group: DCP reads and writes as one process."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized())


@contextmanager
def _as_asked() -> Iterator[None]:
    """Without DCP's warning that it reads or writes as one process: what we asked for."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def commit(path: Root) -> None:
    """Write `path`'s COMPLETE_MARKER: the manifest of every file under it (storage.base's
    upload_dir format). Call it once every file is written."""
    files = [
        {"path": rel, "size": size}
        for rel, size in ckptio.list_files(path)
        if rel != COMPLETE_MARKER
    ]
    manifest = {"version": MANIFEST_VERSION, "files": files}
    ckptio.write_bytes(ckptio.join(path, COMPLETE_MARKER), json.dumps(manifest).encode())


def publish(local: Path, root: Root, accelerator) -> None:
    """Copy an export written under `local` to `root` (a directory or an fsspec URL) and
    commit it there with its manifest (collective). Each node's first process copies what its
    node wrote (ranks that share no disk each hold their own shards); rank 0 commits last."""
    if accelerator.is_local_main_process:
        for rel, _ in ckptio.list_files(local):
            ckptio.write_bytes(ckptio.join(root, rel), (Path(local) / rel).read_bytes())
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        commit(root)
    accelerator.wait_for_everyone()


def load(
    ckpt: Checkpoint, *, accelerator, parallel, model, optimizer, scheduler, reference, data
) -> dict:
    """Restore everything `save` wrote (collective); returns state.json."""
    import torch.distributed.checkpoint as dcp

    state = read_json(ckpt.path, CHECKPOINT_STATE_FILE)
    if state.get("format", 1) == 1:
        from trainer.checkpoint_v1 import load_v1

        return load_v1(
            ckpt,
            state,
            accelerator,
            parallel=parallel,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            reference=reference,
            data=data,
        )
    if state["format"] != CHECKPOINT_FORMAT:
        raise ValueError(
            f"checkpoint {ckpt.path} has format {state['format']}; this trainer reads 1 and 2"
        )
    acc = accelerator
    target = parallel.checkpoint_state(model, optimizer)
    reader = ckptio.storage_reader(ckpt.path)
    reader.read_metadata()  # UnsafeCheckpoint here, not wrapped in DCP's CheckpointException
    with _as_asked():
        dcp.load(target, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=_alone())
    parallel.load_checkpoint_state(model, optimizer, target)
    scheduler.load_state_dict(_load_bytes(ckptio.join(ckpt.path, "scheduler.pt")))
    data.load_state_dict(_load_bytes(ckptio.join(ckpt.path, "data.pt")))
    saved_world, rank = int(state["world_size"]), acc.process_index
    own = _load_bytes(ckptio.join(ckpt.path, f"rank-{rank if rank < saved_world else 0}.pt"))
    if saved_world == acc.num_processes:
        reference.load_state_dict(own["reference"])
    else:  # rows are keyed: every rank takes every old rank's and finds its own
        rows = [
            row
            for r in range(saved_world)
            for row in _load_bytes(ckptio.join(ckpt.path, f"rank-{r}.pt"))["reference"].get(
                "rows", []
            )
        ]
        reference.load_state_dict({"rows": rows})
    set_rng_state(own["rng"])
    return state


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading byte entries (the optimizer's param groups) with
    load_state instead of DCP's torch.load(weights_only=False)."""

    def load_bytes(self, read_item, value) -> None:
        fqn = read_item.dest_index.fqn
        obj = load_state(fqn, value)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def read_weights(path: Root) -> dict[str, torch.Tensor]:
    """The trainable weights of the checkpoint at `path` (full or adapter), keyed as
    trainer.modeling.trainable_state_dict keys them, read on one process (no process group):
    what an evaluation of a checkpoint loads. Reads format 1 and 2."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not ckptio.exists(ckptio.join(path, ".metadata")):  # format 1
        from safetensors.torch import load

        from contract.runs import CHECKPOINT_WEIGHTS_FILE

        return load(ckptio.read_bytes(ckptio.join(path, CHECKPOINT_WEIGHTS_FILE)))
    reader = ckptio.storage_reader(path)
    metadata = reader.read_metadata()
    flat = {
        key: torch.empty(md.size, dtype=md.properties.dtype)
        for key, md in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(md, TensorStorageMetadata)
    }
    with _as_asked():
        dcp.load(flat, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    return {key.removeprefix("model."): value for key, value in flat.items()}
