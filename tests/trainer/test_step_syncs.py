"""A training step waits for the device once: for the metrics, at the end (issue 25, item 4).

On a GPU every host read of a device value (`.item()`, `float(t)`, `if t:`), and every op
whose output size depends on the data (`nonzero`, boolean-mask indexing, `masked_select`,
`unique`), blocks the host until the queued kernels have run, so the CPU stops feeding the GPU.
On the CPU nothing blocks, but the same ops still pass through torch's dispatcher: this test
records every such op a step issues, outside the batch's host-side collation (host data by
design) and outside `reduce_step_metrics` (the one sync, which the test checks is called once).

Not ours, so not counted: transformers' causal-mask builder reads a padded batch's attention
mask on the host (`masking_utils._ignore_causal_mask_sdpa`: may SDPA skip the mask?), once per
forward. Known, and left: avoiding it means a 4-D mask (no flash attention) or no mask at all.
"""

from __future__ import annotations

import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import trainer.train as train_mod
from trainer.tokenize import TokenBatch

aten = torch.ops.aten
# ops that read a device value on the host, or whose output size depends on the data
SYNCING = {
    aten._local_scalar_dense,
    aten.is_nonzero,
    aten.nonzero,
    aten.masked_select,
    aten._unique2,
    aten.unique_consecutive,
    aten.unique_dim,
    aten.repeat_interleave,
}


def _bool_index(func, args) -> bool:
    """x[mask] / x[mask] = v: an index op with a boolean index tensor."""
    if func.overloadpacket not in (aten.index, aten.index_put, aten.index_put_):
        return False
    indices = args[1] if len(args) > 1 else []
    return any(torch.is_tensor(i) and i.dtype == torch.bool for i in indices or [])


class _Syncs(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: list[str] = []
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused and (func.overloadpacket in SYNCING or _bool_index(func, args)):
            stack = traceback.extract_stack()[:-1]
            if not any(f.filename.endswith("transformers/masking_utils.py") for f in stack):
                self.seen.append(f"{func} at\n" + "".join(traceback.format_list(stack[-6:])))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "kw",
    [
        dict(variant="offline"),
        dict(variant="offline+humanline"),  # the lookahead reference, clipping, the sync
        dict(variant="offline+humanline", objective="kto"),  # aux rows, label counts
    ],
    ids=["dpo-offline", "dpo-humanline", "kto-humanline"],
)
def test_a_step_reads_the_device_once(tmp_path, make_spec, unpaired_file, monkeypatch, kw):
    if kw.get("objective") == "kto":
        kw = {**kw, "training_file": str(unpaired_file)}
    spec = make_spec(grad_accum=2, batch_size=4, max_steps=4, quality_sample=0, **kw)
    trainer = train_mod.Trainer(spec, tmp_path / "run", progress=False)
    trainer.step(1)  # first-step set-up (lazy state, caches) is not what is measured
    probe = _Syncs()
    reductions = []

    def paused(fn, record=None):
        def call(*args, **kwargs):
            probe.paused += 1
            try:
                if record is not None:
                    record.append(1)
                return fn(*args, **kwargs)
            finally:
                probe.paused -= 1

        return call

    monkeypatch.setattr(
        train_mod, "reduce_step_metrics", paused(train_mod.reduce_step_metrics, reductions)
    )
    trainer.batch_for = paused(trainer.batch_for)  # collation: host tensors by design
    for name in ("collate_fn", "batch_fn"):  # the lookahead's own collation, host too
        if hasattr(trainer.reference, name):
            setattr(trainer.reference, name, paused(getattr(trainer.reference, name)))
    seq_tokens = paused(TokenBatch.seq_tokens.fget)  # counted on the host batch
    monkeypatch.setattr(TokenBatch, "seq_tokens", property(seq_tokens))
    with probe:
        metrics = trainer.step(2)
    assert probe.seen == [], "\n\n".join(probe.seen)
    assert reductions == [1] and metrics["loss"] == metrics["loss"]  # one reduction, a number


def test_row_kept_is_where_the_row_mask_is_set():
    """The integer positions the reference writes through equal a boolean mask's, with aux
    rows narrower and wider than the rows, and in the shared-prefix layout."""
    from trainer.tokenize import TokenSeq, collate

    shared = (1, 5, 6, 7)
    batch = collate([TokenSeq(shared, (8, 9)), TokenSeq(shared, (10,))], pad_id=0)
    for aux_rows in ([TokenSeq((2, 3), (4,))], [TokenSeq((2,), (11, 12, 13, 14, 15))]):
        batch.aux = collate(aux_rows, pad_id=0)
        where = batch.row_mask().reshape(-1).nonzero().squeeze(1)
        assert batch.row_kept().tolist() == where.tolist()
    batch.aux = None
    assert batch.row_kept().tolist() == batch.mask.reshape(-1).nonzero().squeeze(1).tolist()
