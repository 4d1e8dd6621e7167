"""An out-of-memory error after a backward has run (micro-batch 2 of 2, the last one) is redone
with a finer split, and the run equals choosing that split up front: the failed attempt's
gradient of micro-batch 1 is gone. Under FSDP2 that gradient sits in the unsharded
accumulation buffers, which optimizer.zero_grad does not clear (issue 38). Injected where it
bites, not before the first forward as tests/trainer/test_micro_batch.py's injections are.
"""

import subprocess
import sys

import pytest
import torch

from contract.memory import BUILTIN_SHAPES, GiB
from contract.micro_batch import choose_micro_batch
from tests.trainer.test_micro_batch import REPO, assert_same_run, events
from trainer import memory as trainer_memory
from trainer import train as train_module
from trainer.train import train
from worker.launch import trainer_command
from worker.routing import Placement, trainer_env


def budget_for(spec, accum: int, world: int = 1) -> float:
    """A memory budget (GiB) for which the estimate picks `accum` micro-batches."""
    shape = BUILTIN_SHAPES["tiny-llama"]
    for gib in [x / 1000 for x in range(200, 20000, 5)]:
        choice = choose_micro_batch(spec, shape, int(gib * GiB), world=world)
        if choice.fits and choice.grad_accum == accum:
            return gib
    pytest.skip(f"no budget makes the estimate choose grad_accum {accum}")


def _fail_once(monkeypatch, call: int) -> list[int]:
    """The `call`-th policy forward of the run raises once (after the earlier ones' backward)."""
    real, calls = train_module.batch_logps, []

    def failing(model, batch, temperature=1.0):
        calls.append(batch.input_ids.shape[0])
        if len(calls) == call:
            raise torch.OutOfMemoryError("injected after a backward")
        return real(model, batch, temperature)

    monkeypatch.setattr(train_module, "batch_logps", failing)
    return calls


@pytest.fixture
def spec(make_spec):
    # humanline DPO (the lookahead reference must find its rows under the new split); fp32 and
    # no checkpointing, so the two runs differ only in the split: DPO's loss is a mean over
    # pairs, so 2 or 4 micro-batches give one gradient up to float summation order (1e-6)
    return make_spec(
        variant="offline+humanline",
        batch_size=8,
        max_steps=3,
        checkpoint_every=1,
        activation_checkpointing="off",
    )


def _strategy(spec, strategy: str):
    return spec.model_copy(
        update={"parallelism": spec.parallelism.model_copy(update={"strategy": strategy})}
    )


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])  # one process: plain, and FSDP2 alone
def test_out_of_memory_after_a_backward_equals_the_finer_split_up_front(
    tmp_path, spec, monkeypatch, strategy
):
    spec = _strategy(spec, strategy)
    monkeypatch.setenv(trainer_memory.MEMORY_LIMIT_ENV, str(budget_for(spec, 2)))
    calls = _fail_once(monkeypatch, call=4)  # step 2, micro-batch 2 of 2: after 1's backward
    train(spec, tmp_path / "oom", progress=False)
    (oom,) = events(tmp_path / "oom", "out_of_memory")
    assert [oom["data"][k] for k in ("step", "grad_accum", "micro_batch")] == [2, 4, 2]
    assert calls == [8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 4]
    monkeypatch.setattr(train_module, "batch_logps", train_module.batch_logps)
    monkeypatch.delenv(trainer_memory.MEMORY_LIMIT_ENV)
    # step 1 at grad_accum 2 equals step 1 at 4 (DPO: a mean over pairs), so grad_accum 4
    # throughout is "that split chosen up front"
    train(spec.model_copy(update={"grad_accum": 4}), tmp_path / "hand", progress=False)
    assert_same_run(tmp_path / "oom", tmp_path / "hand")


@pytest.mark.slow
def test_two_processes_out_of_memory_after_a_backward_resume_like_the_finer_split(tmp_path, spec):
    """DDP on two processes: the OOM in micro-batch 2 of step 2 (micro-batch 1's backward done,
    its gradient not yet all-reduced: no collective is pending) stops the attempt; the next one
    resumes from step 1's checkpoint with the finer split and ends where that split run ends."""
    out, hand = tmp_path / "run", tmp_path / "hand"
    place = Placement(2, cpu=True)
    env = {**trainer_env(place), "OMP_NUM_THREADS": "1"}

    def run(job, where, resume=False, **extra):
        path = tmp_path / f"{where.name}.json"
        path.write_text(job.model_dump_json())
        argv = trainer_command(sys.executable, path, where, resume=resume, place=place)
        argv[argv.index("trainer")] = "tests.trainer.oom_child"
        return subprocess.run(
            argv, capture_output=True, text=True, env={**env, **extra}, cwd=REPO, timeout=300
        )

    budget = str(budget_for(spec, 2, world=2))  # 8 pairs, 4 a rank: 2 micro-batches of 2
    first = run(
        spec, out, **{trainer_memory.MEMORY_LIMIT_ENV: budget, "HUMANLINE_TEST_OOM_CALL": "4"}
    )
    assert first.returncode != 0
    (oom,) = events(out, "out_of_memory")
    assert [oom["data"][k] for k in ("step", "grad_accum", "micro_batch")] == [2, 4, 1]
    second = run(spec, out, resume=True, **{trainer_memory.MEMORY_LIMIT_ENV: budget})
    assert second.returncode == 0, second.stderr[-3000:]
    assert events(out, "started")[-1]["data"]["grad_accum"] == 4
    done = run(spec.model_copy(update={"grad_accum": 4}), hand)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_run(out, hand)
