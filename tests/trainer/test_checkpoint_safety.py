"""Checkpoint files are read with torch.load(weights_only=True) (issue 14 #13): tensors, plain
data and trainer.checkpoint.CHECKPOINT_TYPES load; a pickle that would run code is refused on
resume with a clear error, and its code never runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from trainer import checkpoint
from trainer.checkpoint import UnsafeCheckpoint, load_state
from trainer.online.rounds import Round
from trainer.recipes.grpo import GRPOGroup
from trainer.recipes.kto import Unpaired
from trainer.tokenize import TokenSeq
from trainer.train import train


class Payload:
    """What a hostile checkpoint holds: unpickling it runs a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_plain_data_and_the_allowed_classes_load(tmp_path):
    seq = TokenSeq((1, 2), (3,))
    state = {
        "rng": {"torch": torch.get_rng_state(), "python": (3, (1, 2), None)},
        "data": {"cursor": 4, "round": Round(1, 2, 3, [(seq, seq), GRPOGroup((seq,), (0.5,)),
                                                      Unpaired(seq, True)], {"kl": 0.1})},
    }  # fmt: skip
    torch.save(state, tmp_path / "rank-0.pt")
    loaded = load_state(tmp_path / "rank-0.pt")
    assert loaded["data"] == state["data"]
    assert torch.equal(loaded["rng"]["torch"], state["rng"]["torch"])


def test_numpy_rng_states_of_older_checkpoints_still_load(tmp_path):
    """Rank files written before numpy's RNG state became a list hold it as an array: jobs
    checkpointed before the upgrade must still resume."""
    import numpy as np

    state = np.random.get_state()
    torch.save({"numpy": state}, tmp_path / "rank-0.pt")
    loaded = load_state(tmp_path / "rank-0.pt")["numpy"]
    assert loaded[0] == state[0] and (loaded[1] == state[1]).all() and loaded[2:] == state[2:]


def test_a_pickle_that_runs_code_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"reference": {}, "data": {}, "x": Payload(marker)}, tmp_path / "rank-0.pt")
    with pytest.raises(UnsafeCheckpoint, match="rank-0.pt holds more than tensors"):
        load_state(tmp_path / "rank-0.pt")
    assert not marker.exists()


def test_resume_refuses_a_checkpoint_holding_a_hostile_pickle(tmp_path, make_spec):
    spec = make_spec(max_steps=2, checkpoint_every=1, quality_sample=0)
    out = tmp_path / "run"
    assert train(spec, out, progress=False).status == "succeeded"
    last = checkpoint.latest(out / "checkpoints")
    assert last is not None and last.step == 2
    # The genuine state (it loads, RNG as plain data) with a payload slipped in.
    rank = last.path / "rank-0.pt"
    state = load_state(rank)
    marker = tmp_path / "ran"
    torch.save({**state, "x": Payload(marker)}, rank)

    with pytest.raises(UnsafeCheckpoint) as refused:
        train(spec, out, resume=True, progress=False)
    assert "checkpoint file rank-0.pt holds more than tensors and plain data" in str(refused.value)
    assert "os.system" in str(refused.value) or "posix.system" in str(refused.value)
    assert not marker.exists()

    # The scheduler and data files go through the same check.
    torch.save(state, rank)
    for name in ("scheduler.pt", "data.pt"):
        good = (last.path / name).read_bytes()
        torch.save({"x": Payload(marker)}, last.path / name)
        with pytest.raises(UnsafeCheckpoint, match=name):
            train(spec, out, resume=True, progress=False)
        assert not marker.exists()
        (last.path / name).write_bytes(good)

    # DCP's own metadata is a pickle: read by a restricted unpickler, never run
    import pickle

    (last.path / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(UnsafeCheckpoint, match="posix.system|os.system"):
        train(spec, out, resume=True, progress=False)
    with pytest.raises(UnsafeCheckpoint):
        checkpoint.read_weights(last.path)  # an evaluation's read, too
    assert not marker.exists()
