"""Trainer-side conventions from the paper and the authors' code (issue 12): KTO's z0 and λ,
humanline sampling's bound M, temperature in log-probs, zero-variance GRPO groups, the data-quality
sample, the seed helper, the warm-up+constant schedule, and KTO's mismatched rows under no_grad."""

from __future__ import annotations

import json
import math

import pytest
import torch

from contract.spec import HumanlineParams, JobSpec, KTOConfig
from trainer.logps import batch_logps, token_logps
from trainer.losses import humanline as humanline_mod
from trainer.losses import kto_loss, token_log_ratios
from trainer.modeling import load_policy, resolve_model
from trainer.online.pairs import Scored, grpo_groups
from trainer.quality import quality_batches
from trainer.seeds import derive_seed
from trainer.tokenize import TokenSeq, collate


# ---- KTO: z0 over the non-zero KL rewards; λ in the reward's dtype ------------------------------
def test_kto_z0_divides_by_the_count_of_nonzero_kl_rewards():
    """The paper's KTO listing and HALOs ``KTOTrainer.loss``: KL = Σ KL_rewards / #(KL_rewards ≠ 0),
    clamped at 0. Mismatched rewards [2, 0, 1] give z0 = 3/2, not the plain mean 1."""
    pol = torch.tensor([[0.5], [-1.0], [0.2]], dtype=torch.float64, requires_grad=True)
    ref, mask = torch.zeros(3, 1, dtype=torch.float64), torch.ones(3, 1)
    kl_pol = torch.tensor([[1.5, 0.5], [0.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    kl_ref, kl_mask = torch.zeros(3, 2, dtype=torch.float64), torch.tensor([[1, 1], [1, 1], [1, 0]])
    labels = torch.tensor([True, False, True])
    out = kto_loss(pol, ref, mask, labels, kl_pol, kl_ref, kl_mask, KTOConfig())
    assert out.metrics["kl"] == pytest.approx(1.5, abs=1e-12)


def test_kto_lambda_is_not_rounded_through_float32():
    """λ_D = 1.1 is not a float32 number (1.10000002384…); a float64 loss must use 1.1 itself."""
    cfg = KTOConfig()
    pol = torch.tensor([[0.3], [-0.4]], dtype=torch.float64)
    zeros, ones = torch.zeros(2, 1, dtype=torch.float64), torch.ones(2, 1)
    kl = torch.full((2, 1), -5.0, dtype=torch.float64)  # z0 clamps to 0
    out = kto_loss(pol, zeros, ones, torch.tensor([True, False]), kl, zeros, ones, cfg)

    def sig(x):
        return 1 / (1 + math.exp(-x))

    expected = (1.1 * (1 - sig(0.25 * 0.3)) + 1.0 * (1 - sig(0.25 * 0.4))) / 2
    assert abs(out.loss.item() - expected) < 1e-15, out.loss.item() - expected


# ---- humanline sampling: M = the batch's largest ratio ------------------------------------------
def test_sample_mode_bounds_by_the_batch_max_over_completion_tokens(monkeypatch):
    """HALOs ``get_humanline_mask``: reject when ratio < M·B with M the largest ratio (and the
    same for the inverse ratio). Beta draws fixed: B_P = 0.9, B_R = 0.1."""
    draws = {0.5: 0.9, 0.01: 0.1}  # keyed by γ: the defaults γ_P 0.5, γ_R 0.01
    monkeypatch.setattr(
        humanline_mod,
        "_beta",
        lambda c1, c0, like, gen: torch.full(like.shape, draws[c1], dtype=torch.float64),
    )
    ratios = torch.tensor([[0.5, 0.4, 7.0]])  # the third token is padding
    pol, ref, mask = ratios.log(), torch.zeros(1, 3), torch.tensor([[1, 1, 0]])
    hp = HumanlineParams(mode="sample")
    _, rejected = token_log_ratios(pol, ref, mask, hp)
    # M_P = 0.5 (padding excluded): 0.5 < 0.45? no; 0.4 < 0.45 yes. M_R = 2.5: 1/ratio < 0.25? no.
    assert rejected.tolist() == [[False, True, False]]
    _, fixed = token_log_ratios(pol, ref, mask, HumanlineParams(mode="sample", M_P=1.0, M_R=1.0))
    assert fixed.tolist() == [[True, True, False]]  # M = 1 does not bound these ratios: 0.5 < 0.9


# ---- temperature in log-probs -------------------------------------------------------------------
class _Logits(torch.nn.Module):
    """Returns fixed logits [N, L, V] whatever it is asked (token_logps only reads `.logits`)."""

    def __init__(self, logits):
        super().__init__()
        self.logits = torch.nn.Parameter(logits)

    def forward(self, input_ids, attention_mask, logits_to_keep, use_cache, **_):
        return type("Out", (), {"logits": self.logits[:, logits_to_keep]})()


def test_logps_divide_logits_by_the_sampling_temperature():
    """open-r1-humanline ``_get_per_token_logps_and_entropies``:
    ``logits = logits / self.temperature``."""
    batch = collate([TokenSeq((1, 2), (3, 4))], pad_id=0, share_prompts=False)
    logits = torch.randn(1, 4, 6, generator=torch.Generator().manual_seed(0))
    model = _Logits(logits)
    got = token_logps(model, batch, temperature=0.7)
    want = (
        torch.log_softmax(logits[:, batch.positions] / 0.7, -1)
        .gather(-1, batch.labels.unsqueeze(-1))
        .squeeze(-1)
    )
    assert torch.allclose(got, want * batch.mask, atol=1e-6)
    assert not torch.allclose(token_logps(model, batch), got)


# ---- zero-variance GRPO groups ------------------------------------------------------------------
def test_zero_variance_groups_are_kept_or_dropped_as_asked():
    """The math setup keeps every group (TRL's GRPO trainer, which the authors' code subclasses,
    filters none); the default drops spreads below τ (DAPO's dynamic sampling)."""
    flat = [Scored(0, "a", (1,), 1.0), Scored(0, "b", (2,), 1.0)]
    spread = [Scored(1, "c", (3,), 0.0), Scored(1, "d", (4,), 1.0)]
    assert [g.prompt_index for g in grpo_groups([flat, spread])] == [1]
    assert [g.prompt_index for g in grpo_groups([flat, spread], zero_variance="keep")] == [0, 1]


# ---- data-quality sample and seeds --------------------------------------------------------------
def test_quality_sample_is_random_and_seeded():
    def picked(seed, n=1000, k=64):
        return [i for b in quality_batches(n, list, k, seed) for i in b]

    a = picked(derive_seed(0, "quality"))
    assert len(a) == 64 == len(set(a)) and a != list(range(64)) and max(a) > 500
    assert a == picked(derive_seed(0, "quality")) and a != picked(derive_seed(1, "quality"))
    assert sorted(picked(3, n=10)) == list(range(10))  # fewer examples than asked: all of them


def test_seed_streams_are_distinct_and_stable():
    seeds = {derive_seed(0, s, 1) for s in ("plan", "prompts", "sample", "humanline", "round")}
    assert len(seeds) == 5 and all(0 <= s < 2**31 for s in seeds)
    varied = {derive_seed(0, "plan", 1), derive_seed(0, "plan", 2), derive_seed(1, "plan", 1)}
    assert len(varied) == 3  # the step and the job's seed both change the stream
    # blake2b("7:plan:3"), 31 bits
    assert derive_seed(7, "plan", 3) == derive_seed(7, "plan", 3) == 59955683


# ---- schedule: warm-up 10%, then constant -------------------------------------------------------
@pytest.mark.parametrize("schedule", ["constant_with_warmup", "linear"])
def test_learning_rate_warms_up_then_stays_constant(tmp_path, make_spec, schedule):
    """open-r1-humanline: ``lr_scheduler_type: constant_with_warmup``, ``warmup_ratio: 0.1``."""
    from trainer.train import train

    spec = make_spec(
        max_steps=10,
        quality_sample=0,
        optim={"lr": 1e-3, "warmup_ratio": 0.1, "schedule": schedule},
    )
    train(spec, tmp_path, progress=False)
    lrs = [json.loads(ln)["lr"] for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(1e-3)  # one warm-up step of ten
    if schedule == "constant_with_warmup":
        assert lrs[1:] == pytest.approx([1e-3] * 9)
    else:  # the old schedule is still there: linear decay to 0
        assert lrs[-1] == pytest.approx(1e-3 / 9) and sorted(lrs[1:], reverse=True) == lrs[1:]
    events = [json.loads(ln) for ln in (tmp_path / "events.jsonl").read_text().splitlines()]
    started = next(e for e in events if e["kind"] == "started")
    assert started["data"]["schedule"] == schedule and started["data"]["lr"] == 1e-3
    assert (
        f"schedule {schedule}" in started["message"] and "preset instruction" in started["message"]
    )


# ---- KTO: mismatched rows under no_grad ---------------------------------------------------------
def test_kto_mismatched_rows_carry_no_graph_and_leave_the_gradient_unchanged():
    """z0 is detached (paper: "no backpropagation through z0"; HALOs ``policy_KL_logps.detach()``),
    so scoring the mismatched rows without a graph gives the same gradient as scoring them with
    one."""
    torch.manual_seed(0)
    spec = JobSpec(base_model="tiny-llama", training_file="x.jsonl", objective="kto")
    model = load_policy(spec, resolve_model("tiny-llama")).eval()
    gen = torch.Generator().manual_seed(1)

    def ids(n):
        return tuple(int(t) for t in torch.randint(3, 500, (n,), generator=gen))

    prompts, completions = [ids(7), ids(5), ids(9)], [ids(6), ids(3), ids(8)]
    own = [TokenSeq(p, c) for p, c in zip(prompts, completions, strict=True)]
    mismatched = [TokenSeq(p, completions[(i + 1) % 3]) for i, p in enumerate(prompts)]
    labels = torch.tensor([True, False, True])
    ref_shift = 0.3  # a reference below the policy, so z0 > 0 and matters

    def loss_and_grads(pol, mask):
        out = kto_loss(
            pol[:3],
            pol[:3].detach() - ref_shift,
            mask[:3],
            labels,
            pol[3:],
            pol[3:].detach() - ref_shift,
            mask[3:],
            KTOConfig(),
        )
        model.zero_grad(set_to_none=True)
        out.loss.backward()
        return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    new_batch = collate(own, 0)
    new_batch.aux = collate(mismatched, 0)
    aux_only = batch_logps(model, new_batch)[3:].sum()  # the mismatched rows reach no weight
    model.zero_grad(set_to_none=True)
    aux_only.backward()
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    new_pol = batch_logps(model, new_batch)
    new, g_new = loss_and_grads(new_pol, new_batch.row_mask())
    old_batch = collate(own + mismatched, 0)  # the old path: one forward, graph on every row
    old, g_old = loss_and_grads(token_logps(model, old_batch), old_batch.mask)
    new_kl, old_kl = new.floats()["kl"], old.floats()["kl"]
    assert new_kl == pytest.approx(old_kl, abs=1e-5) and new_kl > 0
    assert new.loss.item() == pytest.approx(old.loss.item(), abs=1e-6)
    assert g_new.keys() == g_old.keys()
    for name in g_old:
        assert torch.allclose(g_new[name], g_old[name], atol=1e-6), name
