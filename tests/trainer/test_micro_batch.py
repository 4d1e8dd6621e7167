"""The trainer chooses its micro-batch (spec.grad_accum unset) and answers an out-of-memory
error by splitting the batch finer: the result equals choosing that split up front.

A CPU cannot run out of memory on cue, so the tests give the trainer a memory budget
(HUMANLINE_TRAIN_MEMORY_GIB, what a worker's limit would be) or inject torch.OutOfMemoryError
into the policy's forward (tests/trainer/oom_child.py).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from contract.memory import BUILTIN_SHAPES, GiB
from contract.micro_batch import choose_micro_batch
from contract.runs import MICRO_BATCH_FILE
from trainer import memory as trainer_memory
from trainer import train as train_module
from trainer.checkpoint import read_weights
from trainer.train import train
from worker.launch import trainer_command
from worker.routing import Placement, trainer_env

REPO = Path(__file__).resolve().parents[2]


def events(out: Path, kind: str) -> list[dict]:
    lines = (out / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["kind"] == kind]


def losses(out: Path) -> list[float]:
    return [json.loads(ln)["loss"] for ln in (out / "metrics.jsonl").read_text().splitlines()]


def weights(out: Path) -> dict[str, torch.Tensor]:
    steps = sorted((out / "checkpoints").iterdir(), key=lambda p: int(p.name.split("-")[1]))
    return read_weights(steps[-1])


def assert_same_run(a: Path, b: Path, atol: float = 1e-6) -> None:
    assert losses(a) == pytest.approx(losses(b), abs=atol)
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= atol


@pytest.fixture
def spec(make_spec):
    # humanline DPO: the lookahead reference scores steps ahead, so a changed split must still
    # find every row's reference log-probs
    return make_spec(variant="offline+humanline", batch_size=8, max_steps=3, checkpoint_every=1)


def budget_for(spec, accum: int) -> float:
    """A memory budget (GiB) for which the estimate picks `accum` micro-batches."""
    shape = BUILTIN_SHAPES["tiny-llama"]
    for gib in [x / 1000 for x in range(200, 20000, 5)]:
        choice = choose_micro_batch(spec, shape, int(gib * GiB))
        if choice.fits and choice.grad_accum == accum and not choice.activation_checkpointing:
            return gib
    pytest.skip(f"no budget makes the estimate choose grad_accum {accum}")


def test_a_default_batch_that_does_not_fit_is_split_and_equals_the_hand_set_run(
    tmp_path, spec, monkeypatch
):
    monkeypatch.setenv(trainer_memory.MEMORY_LIMIT_ENV, str(budget_for(spec, 4)))
    auto = train(spec.model_copy(update={"activation_checkpointing": "off"}), tmp_path / "auto")
    assert auto.status == "succeeded"
    started = events(tmp_path / "auto", "started")[-1]["data"]
    assert started["grad_accum"] == 4 and started["micro_batch"] == 2
    monkeypatch.delenv(trainer_memory.MEMORY_LIMIT_ENV)
    hand = spec.model_copy(update={"grad_accum": 4, "activation_checkpointing": "off"})
    train(hand, tmp_path / "hand")
    assert events(tmp_path / "hand", "started")[-1]["data"]["grad_accum"] == 4
    assert_same_run(tmp_path / "auto", tmp_path / "hand")


def _inject_oom(monkeypatch, max_rows: int, from_call: int = 1) -> list[int]:
    """Policy forwards of more than `max_rows` rows raise, from the `from_call`-th forward on."""
    real, calls = train_module.batch_logps, []

    def limited(model, batch, temperature=1.0):
        calls.append(batch.input_ids.shape[0])
        if len(calls) >= from_call and batch.input_ids.shape[0] > max_rows:
            raise torch.OutOfMemoryError("injected")
        return real(model, batch, temperature)

    monkeypatch.setattr(train_module, "batch_logps", limited)
    return calls


def test_out_of_memory_in_a_step_halves_the_micro_batch_and_redoes_the_step(
    tmp_path, spec, monkeypatch
):
    monkeypatch.setenv(trainer_memory.MEMORY_LIMIT_ENV, "1000")  # the estimate picks one split
    calls = _inject_oom(monkeypatch, max_rows=8, from_call=2)  # step 1 fits, step 2 does not
    train(spec, tmp_path / "oom")
    (oom,) = events(tmp_path / "oom", "out_of_memory")
    assert [oom["data"][k] for k in ("step", "grad_accum", "micro_batch")] == [2, 2, 4]
    assert calls == [16, 16, 8, 8, 8, 8]  # step 1 whole, step 2 refused, then halves
    monkeypatch.setattr(train_module, "batch_logps", train_module.batch_logps)
    # the same run with the split set up front from step 2 on cannot be asked for, so compare
    # with grad_accum 2 throughout: one split or two is the same DPO step (mean over pairs)
    train(spec.model_copy(update={"grad_accum": 2}), tmp_path / "hand")
    assert_same_run(tmp_path / "oom", tmp_path / "hand")


def test_out_of_memory_with_a_user_set_grad_accum_or_one_example_is_a_clear_error(
    tmp_path, spec, monkeypatch
):
    _inject_oom(monkeypatch, max_rows=1)
    with pytest.raises(RuntimeError, match="grad_accum is set to 2: raise it"):
        train(spec.model_copy(update={"grad_accum": 2}), tmp_path / "set")
    with pytest.raises(RuntimeError, match="a micro-batch is already one example"):
        train(spec, tmp_path / "auto")
    assert [e["data"]["micro_batch"] for e in events(tmp_path / "auto", "out_of_memory")] == [
        4,
        2,
        1,
    ]


@pytest.mark.slow
def test_two_processes_out_of_memory_stop_and_resume_with_half_the_micro_batch(tmp_path, spec):
    """Ranks cannot leave a collective alone: the attempt stops (no hang) with the split asked
    for written down, and the next attempt resumes from the last checkpoint with it."""
    out = tmp_path / "run"
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json())
    place = Placement(2, cpu=True)
    env = {
        **trainer_env(place),
        "OMP_NUM_THREADS": "1",
        trainer_memory.MEMORY_LIMIT_ENV: "1000",
        "HUMANLINE_TEST_OOM_ROWS": "4",
    }
    argv = trainer_command(sys.executable, path, out, resume=False, place=place)
    argv[argv.index("trainer")] = "tests.trainer.oom_child"
    first = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert first.returncode != 0
    asked = json.loads((out / MICRO_BATCH_FILE).read_text())
    assert asked == {"grad_accum": 2, "micro_batch": 2, "step": 1}
    env["HUMANLINE_TEST_OOM_ROWS"] = "4"  # still too small for 4 pairs a rank, fine for 2
    again = trainer_command(sys.executable, path, out, resume=True, place=place)
    again[again.index("trainer")] = "tests.trainer.oom_child"
    second = subprocess.run(again, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert events(out, "started")[-1]["data"]["grad_accum"] == 2
    assert len(losses(out)) == 3


def test_auto_checkpointing_is_chosen_when_it_lets_a_larger_micro_batch_fit(
    tmp_path, spec, monkeypatch
):
    shape = BUILTIN_SHAPES["tiny-llama"]
    for gib in [x / 1000 for x in range(200, 5000)]:
        choice = choose_micro_batch(spec, shape, int(gib * GiB))
        if choice.fits and choice.activation_checkpointing:
            break
    else:
        pytest.skip("no budget makes checkpointing the larger fit")
    off = choose_micro_batch(
        spec.model_copy(update={"activation_checkpointing": "off"}), shape, int(gib * GiB)
    )
    assert off.micro_examples < choice.micro_examples  # why it was turned on
    monkeypatch.setenv(trainer_memory.MEMORY_LIMIT_ENV, str(gib))
    train(spec.model_copy(update={"max_steps": 1}), tmp_path / "run")
    started = events(tmp_path / "run", "started")[-1]["data"]
    assert started["activation_checkpointing"] is True
    assert started["grad_accum"] == choice.grad_accum
