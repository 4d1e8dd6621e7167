"""Every objective's loss keeps to the policy's device, without a GPU.

The trainer collates batches on the host and the policy scores them on its own device, so a
recipe that combines a batch tensor (a mask, a label) with the log-probs must move it there
first (the step hands it its device copy of the batch, tests/trainer/test_device_batch.py,
where the move is a no-op; any other caller may hand a host batch). On a CPU-only machine
both are on the CPU and nothing would show a slip: here the loss of a real training step is
called again with the policy's and the reference's log-probs on the `meta` device (shapes
without data; an op that mixes it with a CPU tensor is refused, as one that mixes CUDA and
CPU is), the batch as the trainer made it. Found on an H100: DPO's
masks stayed on the CPU and every DPO job failed at step 1, on every device but the CPU.
"""

from __future__ import annotations

import pytest
import torch

import trainer.train as train_mod
from trainer.synthetic import write_jsonl

PROMPTS = [{"prompt": f"What is {a} + 3?", "answer": str(a + 3)} for a in range(8)]
ONLINE = {"num_samples": 4, "max_new_tokens": 6, "tau": 0.0, "engine": "hf"}
CASES = {
    "dpo": {"objective": "dpo"},
    "dpo-lora": {"objective": "dpo", "adapter": {"kind": "lora", "r": 4}},
    "dpo-offline": {"objective": "dpo", "variant": "offline"},
    "kto": {"objective": "kto"},  # on the unpaired file
    "grpo-online": {  # on PROMPTS
        "objective": "grpo",
        "batch_size": 8,
        "online": {**ONLINE, "rewards": [{"name": "math_accuracy"}]},
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_loss_runs_with_the_policy_on_another_device(
    case, tmp_path, make_spec, unpaired_file, recorded_losses, monkeypatch
):
    calls, holder = recorded_losses
    kw = {"variant": "offline+humanline", "max_steps": 1, "quality_sample": 0} | CASES[case]
    if case == "kto":
        kw["training_file"] = str(unpaired_file)
    if case == "grpo-online":
        kw |= {"variant": "online+humanline", "training_file": str(tmp_path / "prompts.jsonl")}
        write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    train_mod.Trainer(make_spec(**kw), tmp_path / "run", progress=False).step(1)
    assert calls, "the step called no loss"
    call = calls[0]
    batch, args = call["batch"], (call["mb"], call["examples"], call["ctx"])
    assert batch.mask.device.type == "cpu"  # as collated: what the loss must move

    # Metrics stay on the device (a detached tensor each: the step copies them to the host once),
    # and KTO counts its desirable examples on the host labels the recipe passes: the whole loss
    # runs on meta tensors, which would fail at any host copy or device sync.
    pol = torch.empty(call["pol"].shape, device="meta", requires_grad=True)
    ref = torch.empty(call["ref"].shape, device="meta")
    out = holder["loss"](pol, ref, batch, *args)
    assert out.loss.device.type == "meta" and out.loss.shape == ()
    devices = {m.device.type for m in out.metrics.values()}
    assert "meta" in devices <= {"meta", "cpu"}  # counts are host values


@pytest.mark.parametrize("device, share", [("cpu", True), ("cuda", False), ("cuda:1", False)])
def test_rows_share_a_prompt_pass_only_on_the_cpu(device, share):
    """On a GPU the second (prompt) pass doubles a small model's kernel launches: one pass was
    1.8x faster on an H100 (trainer.distributed's docstring)."""
    from types import SimpleNamespace

    from trainer.distributed import Replicated

    assert Replicated(SimpleNamespace(device=torch.device(device))).share_prompts == share
