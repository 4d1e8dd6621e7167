"""The scoring context of the references that run the policy itself (trainer.reference):
no dropout in what they score, and no walk over every module to get there (a 30-layer model's
`eval()` and back cost 3-6 % of a humanline step on an H100, 7-9 % with LoRA: docs/deploy.md)."""

from __future__ import annotations

import torch

from tests.trainer.conftest import moved_policy
from trainer.logps import batch_logps
from trainer.reference import AdapterOff, Lookahead
from trainer.tokenize import TokenSeq, collate


def _lora_policy(dropout: float) -> torch.nn.Module:
    return moved_policy(kind="lora", r=4, alpha=8, dropout=dropout)


def _batch():
    gen = torch.Generator().manual_seed(1)
    ids = lambda n: tuple(int(t) for t in torch.randint(3, 500, (n,), generator=gen))  # noqa: E731
    return collate([TokenSeq(ids(7), ids(9)), TokenSeq(ids(5), ids(12))], 0)


def _count_train_calls(monkeypatch) -> list[torch.nn.Module]:
    calls: list[torch.nn.Module] = []
    original = torch.nn.Module.train

    def train(self, mode=True):
        calls.append(self)
        return original(self, mode)

    monkeypatch.setattr(torch.nn.Module, "train", train)
    return calls


def test_lookahead_scores_without_lora_dropout_and_switches_only_the_dropout(monkeypatch):
    model = _lora_policy(dropout=0.5)
    assert model.training
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    assert dropouts  # LoRA's adapter.dropout: the one noise the load leaves on
    batch = _batch()
    ref = Lookahead(model, lambda s, m: batch, accum=1)
    calls = _count_train_calls(monkeypatch)
    ref.refresh(0, 2)  # steps 1 and 2 score the same batch with the same weights
    # each dropout off and back on, nothing else: not a walk over the model's modules
    assert len(calls) == 2 * len(dropouts)
    assert {id(m) for m in calls} == {id(m) for m in dropouts}
    assert all(m.training for m in model.modules())  # the policy is back in training mode
    model.eval()
    with torch.no_grad():
        clean = batch_logps(model, batch)
    torch.testing.assert_close(ref.logps(1, 0, batch), clean, rtol=0, atol=1e-6)
    torch.testing.assert_close(ref.logps(2, 0, batch), clean, rtol=0, atol=1e-6)


def test_scoring_a_deterministic_policy_switches_nothing(monkeypatch):
    model = _lora_policy(dropout=0.0)
    batch = _batch()
    calls = _count_train_calls(monkeypatch)
    Lookahead(model, lambda s, m: batch, accum=1).refresh(0, 1)
    AdapterOff(model).logps(1, 0, batch)
    assert calls == []
