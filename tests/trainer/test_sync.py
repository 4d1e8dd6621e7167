"""Reference-sync semantics, checked against independently recomputed log-probs.

For every training step t we record the weights the policy had during that step's forward
(θ_t, i.e. before update t), the batch, and the reference log-probs the loss received. Then
we recompute, with a fresh model holding the weights the spec says the reference must have:
  humanline, every k:    ref_t = logπ_{θ_s}(batch_t), s = last multiple of k before t (θ_1 if t ≤ k)
  trust_region, every k: ref_t = logπ_{θ_{s+1}}(batch_t)   (synced after update s)
  none:                  ref_t = logπ_{θ_1}(batch_t)
"""

import copy

import pytest
import torch

import trainer.train as train_mod
from trainer.logps import token_logps
from trainer.modeling import load_trainable_state_dict
from trainer.plan import BatchPlan


def _expected_source(t: int, sync: str, k: int) -> int:
    """The step whose pre-update weights the reference of step t must hold."""
    if sync == "none" or t <= k:
        return 1
    s = (t - 1) // k * k
    return s if sync == "humanline" else s + 1


@pytest.mark.parametrize(
    "sync, k, lora",
    [
        ("humanline", 1, False),
        ("humanline", 3, False),
        ("humanline", 1, True),
        ("humanline", 3, True),
        ("trust_region", 2, False),
        ("none", 1, False),
        ("none", 1, True),
    ],
)
def test_reference_holds_the_right_weights(recorded_losses, tmp_path, make_spec, sync, k, lora):
    calls, holder = recorded_losses
    spec = make_spec(
        humanline=sync == "humanline",
        reference_sync=sync,
        max_steps=7,
        humanline_params={"sync_every": k},
        quality_sample=0,
        adapter={"kind": "lora", "r": 4, "alpha": 8} if lora else {"kind": "none"},
        optim={"lr": 5e-2 if lora else 1e-2, "warmup_ratio": 0.0},
    )
    train_mod.train(spec, tmp_path, progress=False)
    assert len(calls) == 7
    probe = copy.deepcopy(holder["model"]).eval()
    for t in range(1, 8):
        src = _expected_source(t, sync, k)
        load_trainable_state_dict(probe, calls[src - 1]["weights"])
        with torch.no_grad():
            expected = token_logps(probe, calls[t - 1]["batch"])
        got = calls[t - 1]["ref"]
        assert torch.allclose(got, expected, atol=1e-5), (t, src, (got - expected).abs().max())
        if src != t and t > 1:  # the weights really moved, so the check can tell them apart
            load_trainable_state_dict(probe, calls[t - 1]["weights"])
            with torch.no_grad():
                current = token_logps(probe, calls[t - 1]["batch"])
            assert not torch.allclose(got, current, atol=1e-5), t


def test_k1_humanline_reference_is_previous_step_policy(
    recorded_losses, monkeypatch, tmp_path, make_spec
):
    """The issue's statement: at step s+1 the reference equals the policy of step s."""
    calls, _ = recorded_losses
    spec = make_spec(variant="offline+humanline", max_steps=4, quality_sample=0, batch_size=4)
    # Use one repeated batch so policy(step s) and reference(step s+1) score the same tokens.
    monkeypatch.setattr(BatchPlan, "global_indices", lambda self, step: [0, 1, 2, 3])
    train_mod.train(spec, tmp_path, progress=False)
    for s in range(1, 4):
        assert torch.allclose(calls[s]["ref"], calls[s - 1]["pol"], atol=1e-5)
        assert not torch.allclose(calls[s]["ref"], calls[s]["pol"], atol=1e-5)
