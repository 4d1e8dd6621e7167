"""One device copy of each micro-batch, shared by the reference, the policy and the loss.

A blocking host-to-device copy waits for the GPU's queued work, so the step copies each
micro-batch once (`TokenBatch.to`) instead of once per tensor per use (the policy's pass, the
reference's, the recipe's mask: 11 copies of a DPO micro-batch before). On the CPU every copy
is a no-op, so these tests check what a GPU would see: every tensor of the copy (its shared
prefix's and aux rows' too) on the target device, and one copy per micro-batch reaching all
three consumers.
"""

from __future__ import annotations

from dataclasses import fields

import torch

import trainer.train as train_mod
from trainer.tokenize import TokenBatch, TokenSeq, collate


def _tensors(obj, path=""):
    """(path, tensor) of every tensor field of a TokenBatch, nested prefix and aux included."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if torch.is_tensor(value):
            yield f"{path}{f.name}", value
        elif value is not None and f.name != "rows":  # the rows' token ids: host data
            yield from _tensors(value, f"{path}{f.name}.")


def test_to_moves_every_tensor_and_leaves_the_host_batch():
    shared = (1, 5, 6, 7)
    batch = collate([TokenSeq(shared, (8, 9)), TokenSeq(shared, (10,))], pad_id=0)
    batch.aux = collate([TokenSeq((2, 3), (4,)), TokenSeq((2, 11, 12), (13, 14))], pad_id=0)
    assert batch.prefix is not None and batch.aux.prefix is None  # both layouts

    moved = batch.to("meta")

    host, there = dict(_tensors(batch)), dict(_tensors(moved))
    assert len(host) == 16 and there.keys() == host.keys()  # 6 + 4 (prefix) + 6 (aux)
    for name, tensor in there.items():
        assert tensor.device.type == "meta", name
        assert (tensor.shape, tensor.dtype) == (host[name].shape, host[name].dtype), name
        assert host[name].device.type == "cpu", name  # the host batch is untouched
    assert batch.num_tokens == 3 and batch.seq_tokens == 6 + 5 + 3 + 5  # countable without a device


def test_the_step_copies_each_micro_batch_once_for_all_three(
    tmp_path, make_spec, recorded_losses, monkeypatch
):
    """Offline DPO (a frozen reference model: it scores the batch it is given), 2 micro-batches:
    the reference, the policy and the loss get the one copy `TokenBatch.to` made of each."""
    calls, _ = recorded_losses
    copies: list[TokenBatch] = []
    real_to = TokenBatch.to

    def to(self, device):
        copies.append(real_to(self, device))
        return copies[-1]

    monkeypatch.setattr(TokenBatch, "to", to)
    scored_by_policy: list[TokenBatch] = []
    real_batch_logps = train_mod.batch_logps

    def batch_logps(model, batch, temperature=1.0):
        scored_by_policy.append(batch)
        return real_batch_logps(model, batch, temperature)

    monkeypatch.setattr(train_mod, "batch_logps", batch_logps)
    spec = make_spec(variant="offline", grad_accum=2, batch_size=4, max_steps=1, quality_sample=0)
    trainer = train_mod.Trainer(spec, tmp_path / "run", progress=False)
    scored_by_reference: list[TokenBatch] = []
    real_ref = trainer.reference.logps

    def reference_logps(step, micro, batch):
        scored_by_reference.append(batch)
        return real_ref(step, micro, batch)

    trainer.reference.logps = reference_logps
    trainer.step(1)

    assert len(copies) == 2  # one per micro-batch
    for consumer in (scored_by_reference, scored_by_policy, [c["batch"] for c in calls]):
        assert len(consumer) == 2 and all(b is c for b, c in zip(consumer, copies, strict=True))
