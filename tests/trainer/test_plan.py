"""The batch plan refuses a batch larger than the data (the standalone trainer's guard; the
API fits or refuses it earlier, tests/api/test_jobs.py), instead of training one silent step."""

from __future__ import annotations

import pytest

from trainer.plan import BatchPlan


def test_a_batch_larger_than_the_data_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"has 4 usable training examples, fewer than the 8"):
        BatchPlan(4, 8, grad_accum=1, world=1, rank=0, seed=0, total_steps=1)


def test_a_batch_as_large_as_the_data_is_one_step_an_epoch():
    plan = BatchPlan(8, 8, grad_accum=2, world=1, rank=0, seed=0, total_steps=3)
    assert plan.steps_per_epoch == 1 and plan.micro_size == 4
    assert sorted(plan.global_indices(1)) == list(range(8))
    assert plan.global_indices(2) != plan.global_indices(1)  # a new epoch, reshuffled
