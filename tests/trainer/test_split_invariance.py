"""The same job gives the same result whatever its micro-batch split (issue 38): the split
follows the memory of the GPU a job lands on, and halves after an out-of-memory error. KTO's
reference point z0 and humanline sample mode's bound M are computed over the step's whole
batch, and sample mode's Beta draws are tied to each example's tokens (trainer.stepwide), so
grad_accum 1 and 2 train the same steps.

Tolerance 1e-6 (losses and weights after 3 steps at lr 1e-3): fp32, and the two runs differ
only in how each step's gradient is summed (one backward of the mean, or two of half-means),
a float rounding of ~1e-7 relative that Adam's normalised update carries into the weights at
the scale of lr × rounding. A per-micro-batch z0 or M moves the losses by 1e-3 and more.
"""

from __future__ import annotations

import pytest

from tests.trainer.test_micro_batch import assert_same_run, events
from trainer.train import train

CASES = {
    # KTO: z0 from the mismatched pairs (plain offline and humanline clip)
    "kto": {"objective": "kto", "variant": "offline"},
    "kto-humanline": {"objective": "kto", "variant": "offline+humanline"},
    # humanline sample mode: M over the step's batch, draws per example and token
    "dpo-sample": {"variant": "offline+humanline", "humanline_params": {"mode": "sample"}},
    "kto-sample": {
        "objective": "kto",
        "variant": "offline+humanline",
        "humanline_params": {"mode": "sample"},
    },
}


@pytest.mark.parametrize("case", list(CASES))
def test_two_splits_train_the_same_job(tmp_path, make_spec, unpaired_file, case):
    kw = dict(CASES[case])
    if kw.get("objective") == "kto":
        kw["training_file"] = str(unpaired_file)
    spec = make_spec(
        batch_size=8, max_steps=3, checkpoint_every=1, activation_checkpointing="off", **kw
    )
    for accum in (1, 2):
        job = spec.model_copy(update={"grad_accum": accum})
        assert train(job, tmp_path / f"accum{accum}", progress=False).status == "succeeded"
        started = events(tmp_path / f"accum{accum}", "started")[-1]["data"]
        assert started["grad_accum"] == accum
    assert_same_run(tmp_path / "accum1", tmp_path / "accum2")
