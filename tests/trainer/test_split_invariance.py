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


def test_a_tokens_draws_follow_its_example_not_its_micro_batch_or_padding():
    """trainer.losses.humanline.StepDraws: example 7's j-th completion token gets the same
    B_P and B_R alone in a micro-batch or beside a longer row that pads it, in either call."""
    import torch

    from contract.humanline_params import HumanlineParams
    from trainer.losses.humanline import draw_step

    hp = HumanlineParams(mode="sample")
    tops = [(torch.tensor(0.5, dtype=torch.float64), torch.tensor(0.2, dtype=torch.float64))]
    step = draw_step(hp, tops, {3: 0, 7: 1}, width=8, generator=torch.Generator().manual_seed(0))
    assert step.log_mp.item() == 0.5 and step.log_mr.item() == 0.2
    alone = torch.tensor([[0, 1, 1, 1, 0]])  # example 7: 3 completion tokens after 1 prompt
    together = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 0]])  # 3 then 7
    a, b = step.micro([7]), step.micro([3, 7])
    calls = []
    for _ in range(2):  # the first call (chosen / rows), then the second (rejected / KL rows)
        (pa, ra), (pb, rb) = a.take(alone), b.take(together)
        assert torch.equal(pa[0][alone[0].bool()], pb[1][together[1].bool()])
        assert torch.equal(ra[0][alone[0].bool()], rb[1][together[1].bool()])
        calls.append(pa[0][alone[0].bool()])
    assert not torch.equal(calls[0], calls[1])  # the two calls draw apart
    again = step.micro([7]).take(alone)[0]  # a new view (a redone step) starts at call one
    assert torch.equal(again[0][alone[0].bool()], calls[0])
