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


def _lookahead(model, batch_fn, accum=lambda: 1, max_rows=8) -> Lookahead:
    return Lookahead(
        model,
        batch_fn,
        micro_count=accum,
        collate_fn=lambda rows: collate(rows, 0),
        max_rows=lambda: max_rows,
    )


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
    ref = _lookahead(model, lambda s, m: batch)
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
    _lookahead(model, lambda s, m: batch).refresh(0, 1)
    AdapterOff(model).logps(1, 0, batch)
    assert calls == []


def _rows(n: int, seed: int) -> list[TokenSeq]:
    gen = torch.Generator().manual_seed(seed)
    ids = lambda k: tuple(int(t) for t in torch.randint(3, 500, (k,), generator=gen))  # noqa: E731
    return [TokenSeq(ids(3 + i % 5), ids(2 + (7 * i) % 9)) for i in range(n)]


def test_lookahead_rows_are_read_back_by_any_split_of_the_batch():
    """Scored with the batch split in 2 (and grouped 3 rows a forward), read back split in 4 and
    in 1: each row's log-probs equal a direct no-grad scoring of that split (the micro-batch may
    be halved between a refresh and its step)."""
    model = moved_policy(kind="none")
    rows = {s: _rows(8, seed=s) for s in (1, 2)}
    split = {"accum": 2}

    def batch_fn(s, m):
        n = 8 // split["accum"]
        return collate(rows[s][m * n : (m + 1) * n], 0)

    ref = _lookahead(model, batch_fn, accum=lambda: split["accum"], max_rows=3)
    ref.refresh(0, 2)
    for s in (1, 2):  # reading step 2 drops step 1 (it has run)
        for accum in (4, 1):
            split["accum"] = accum
            for m in range(accum):
                batch = batch_fn(s, m)
                with torch.no_grad():
                    direct = batch_logps(model, batch)
                torch.testing.assert_close(ref.logps(s, m, batch), direct, rtol=0, atol=1e-5)


def test_lookahead_state_round_trips_and_reads_the_old_per_micro_batch_format():
    model = moved_policy(kind="none")
    rows = _rows(6, seed=3)

    def batch_fn(s, m):
        return collate(rows[3 * m : 3 * m + 3], 0)

    ref = _lookahead(model, batch_fn, accum=lambda: 2)
    ref.refresh(0, 1)
    expected = [ref.logps(1, m, batch_fn(1, m)) for m in range(2)]
    again = _lookahead(model, batch_fn, accum=lambda: 2)
    again.load_state_dict(ref.state_dict())
    old = _lookahead(model, batch_fn, accum=lambda: 2)
    old.load_state_dict({"cache": {f"1:{m}": expected[m] for m in range(2)}})
    for reader in (again, old):
        for m in range(2):
            assert torch.equal(reader.logps(1, m, batch_fn(1, m)), expected[m])
    # a step that has run is dropped when a later one is read; an unknown row is an error
    stranger = collate(_rows(2, seed=9), 0)
    try:
        again.logps(1, 0, stranger)
    except RuntimeError as exc:
        assert "no reference log-probs for step 1" in str(exc)
    else:
        raise AssertionError("a row that was never scored must not be read")
