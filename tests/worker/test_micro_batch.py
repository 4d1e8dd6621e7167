"""Out of memory with several processes (issue 25): the attempt is requeued, the next one
starts with the halved micro-batch, and a job out of attempts fails naming what to change.
In-process runner, SQLite, the fake trainer (tests/worker/fake_trainer.py)."""

from __future__ import annotations

import json

import pytest

from contract.runs import MICRO_BATCH_FILE
from tests.worker import fake_trainer
from worker import micro_batch
from worker.runner import Runner


def _runner(local, tmp_path, monkeypatch, max_attempts: int = 5, **env) -> Runner:
    for name, value in {"STEPS": 2, **env}.items():
        monkeypatch.setenv(name, str(value))
    settings = local.settings.model_copy(
        update={
            "TRAINER_PYTHON": str(fake_trainer.install(tmp_path)),
            "MAX_JOB_ATTEMPTS": max_attempts,
        }
    )
    return Runner(settings, local.sessions, local.store)


def _of_kind(local, job_id: str, kind: str) -> list:
    return [e for e in local.events(job_id) if e.kind == kind]


@pytest.mark.parametrize(
    "code, trainer_event",
    [(4, True), (1, False)],  # a lone trainer's EXIT_OUT_OF_MEMORY; accelerate launch's 1
)
def test_out_of_memory_requeues_and_the_next_attempt_starts_with_half(
    local, tmp_path, monkeypatch, code, trainer_event
):
    job_id = local.make_job(max_steps=2)
    runner = _runner(
        local, tmp_path, monkeypatch, FITS=4, OOM_CODE=code, OOM_EVENT=int(trainer_event)
    )
    assert runner.run(job_id) == "released"
    job = local.job(job_id)
    assert job.status == "queued" and job.attempt == 1 and job.error is None
    status = local.events(job_id)[-1]
    assert status.data["to"] == "queued"
    assert status.message == (
        "out of GPU memory at step 1 (attempt 1 of 5); requeued to resume from the last "
        "checkpoint with micro-batches of 4 (grad_accum 2)"
    )
    # one record of it: the trainer's event, or the worker's when the trainer wrote none
    [oom] = _of_kind(local, job_id, "out_of_memory")
    assert (oom.data["grad_accum"], oom.data["micro_batch"], oom.data["step"]) == (2, 4, 1)

    assert runner.run(job_id) == "succeeded"  # another worker would do the same
    started = [(e.data["attempt"], e.data["grad_accum"], e.data["micro_batch"])
               for e in _of_kind(local, job_id, "started")]  # fmt: skip
    assert started == [(1, 1, 8), (2, 2, 4)]  # what each attempt found in micro_batch.json
    assert local.job(job_id).attempt == 2


def test_out_of_memory_on_the_last_attempt_fails_naming_what_to_change(
    local, tmp_path, monkeypatch
):
    job_id = local.make_job(max_steps=2)
    runner = _runner(local, tmp_path, monkeypatch, max_attempts=2, FITS=0)
    assert runner.run(job_id) == "released"
    assert runner.run(job_id) == "failed"
    job = local.job(job_id)
    assert job.attempt == 2
    assert job.error["type"] == "out_of_memory"
    assert (job.error["grad_accum"], job.error["micro_batch"]) == (4, 2)
    assert job.error["message"] == (
        "out of GPU memory on attempt 2, the last one allowed (MAX_JOB_ATTEMPTS) (estimated "
        "61.5 GiB of 79.2 GiB available per GPU); the next try would have used micro-batches "
        "of 2 (grad_accum 4). Lower max_length (or max_prompt_length) or batch_size, set "
        "activation_checkpointing to on, set grad_accum higher, or run on more GPUs or GPUs "
        "with more memory."
    )
    status = local.events(job_id)[-1]
    assert status.data["to"] == "failed" and status.message == job.error["message"]
    assert runner.run(job_id) is None  # failed: not claimable


def test_only_a_micro_batch_the_trainer_wrote_means_out_of_memory(tmp_path):
    """The file the worker wrote at start, a missing or a broken one: a crash, not memory."""
    given = {"grad_accum": 2, "micro_batch": 4, "step": 1}
    assert micro_batch.ran_out(tmp_path, None) is None
    micro_batch.write(tmp_path, given)
    assert micro_batch.ran_out(tmp_path, given) is None
    assert micro_batch.ran_out(tmp_path, None) == given
    (tmp_path / MICRO_BATCH_FILE).write_text(json.dumps({"grad_accum": 4, "micro_batch": 0}))
    assert micro_batch.ran_out(tmp_path, given) is None
    (tmp_path / MICRO_BATCH_FILE).write_text('{"grad_accum": 4, "micro_')  # torn
    assert micro_batch.ran_out(tmp_path, given) is None
