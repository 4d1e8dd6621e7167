"""Humanline off, our DPO/KTO/GRPO losses equal TRL 1.16's, run as TRL's own code.

TRL computes each loss inside ``Trainer._compute_loss(model, inputs)``. We build the trainer
with ``object.__new__`` (no model loading, no datasets), set only the attributes that method
reads, and hand it a stub for a model patched by ``trl.trainer.utils.add_fused_lm_head``: called
with ``fused_lm_head=True`` it returns the per-token log-probs of the next token, zeroed where
the label is -100, exactly the contract of the real fused head. The stub looks its log-probs up
in a table by the first input id, so the same random tensors reach TRL and us.

Conventions bridged here (each is a deliberate difference, not a bug):
- GRPO: TRL's ratio is π/π_old and its KL is against π_ref; ours is π/π_ref for both (the paper
  reuses the reference), so ``old_per_token_logps = ref_per_token_logps = lp_ref``. TRL's
  advantages use the unbiased std; we feed both the same advantages.
- GRPO "dapo" divides by ``num_items_in_batch`` (the generation batch's token count); we pass
  the same number as ``token_normalizer``.
- DPO ``reference_free``: TRL 1.16 dropped the option, so TRL gets zero reference log-probs.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from trl.trainer.dpo_trainer import DPOTrainer
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.kto_trainer import KTOTrainer

from contract.spec import DPOConfig, KTOConfig
from trainer.losses import dpo_loss, grpo_loss, kto_loss

TOL = {"rtol": 0, "atol": 1e-6}


class FusedHeadStub(torch.nn.Module):
    """A causal LM after ``add_fused_lm_head``: per-token log-probs, 0 where the label is -100."""

    is_gradient_checkpointing = False

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table  # [rows, L - 1]: log-prob of token j + 1 of row i

    def forward(self, *, input_ids, labels, fused_lm_head=False, **_):
        assert fused_lm_head, "TRL must ask for the fused head"
        keep = labels[:, 1:] != -100
        log_probs = self.table[input_ids[:, 0]].masked_fill(~keep, 0.0)
        zeros = torch.zeros_like(log_probs.detach())
        return SimpleNamespace(
            log_probs=log_probs,
            entropy=zeros,
            mean_logits=zeros,
            is_top1=zeros.bool(),
            log_sum_sq_probs=zeros,
            aux_loss=None,
        )


class Accel:
    """The accelerate calls TRL's loss code makes, on a single CPU process."""

    device = torch.device("cpu")
    num_processes = 1
    is_main_process = True
    sync_gradients = True

    def gather(self, x):
        return x.reshape(-1)

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def autocast(self):
        return nullcontext()

    def unwrap_model(self, m):
        return m


def _bare(cls, **attrs):
    trainer = object.__new__(cls)
    common = {
        "accelerator": Accel(),
        "aux_loss_enabled": False,
        "_metrics": {"train": defaultdict(list), "eval": defaultdict(list)},
        "_total_train_tokens": 0,
        "_tp_size": 1,
        "args": SimpleNamespace(gradient_checkpointing_kwargs=None),
    }
    for name, value in {**common, **attrs}.items():
        object.__setattr__(trainer, name, value)
    return trainer


def _on_tables(cls, policy: list[torch.Tensor], reference: list[torch.Tensor], **attrs):
    """A bare TRL `cls` whose policy and reference models look their log-probs up in these
    rows (stacked), and the policy's table, whose .grad is then TRL's gradient."""
    table = torch.cat(policy).requires_grad_()
    model, ref_model = FusedHeadStub(table), FusedHeadStub(torch.cat(reference))
    trl = _bare(cls, model=model, ref_model=ref_model, precompute_ref_logps=False, **attrs)
    return trl, table


# TRL 1.16's DPOTrainer attributes for the plain sigmoid loss (beta aside)
DPO_SIGMOID = {
    "ld_alpha": None,
    "f_divergence_type": "reverse_kl",
    "loss_types": ["sigmoid"],
    "loss_weights": [1.0],
    "use_weighting": False,
}


def _rows(n: int, t: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask): a one-token prompt holding the table row, then t tokens."""
    ids = torch.zeros(n, t + 1, dtype=torch.long)
    ids[:, 0] = torch.arange(offset, offset + n)
    return ids, torch.ones(n, t + 1, dtype=torch.long)


def _random(g: torch.Generator, b: int, t: int, spread: float = 0.7):
    """Log-probs with the policy off the reference, ragged masks, garbage under the mask."""
    ref = -torch.rand(b, t, generator=g) * 3
    pol = ref + spread * torch.randn(b, t, generator=g)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t) < lengths[:, None]).float()
    garbage = 5 * torch.randn(b, t, generator=g)
    return torch.where(mask.bool(), pol, garbage), torch.where(mask.bool(), ref, -garbage), mask


def _with_prompt(mask: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros(mask.size(0), 1), mask], dim=1).long()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("reference_free", [False, True])
def test_dpo_matches_trl_sigmoid(seed, reference_free):
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 9
    pol_w, ref_w, m_w = _random(g, b, t)
    pol_l, ref_l, m_l = _random(g, b, t)
    if reference_free:
        ref_w, ref_l = torch.zeros_like(ref_w), torch.zeros_like(ref_l)
    cfg = DPOConfig(beta=0.3, reference_free=reference_free)

    trl, pol_table = _on_tables(
        DPOTrainer, [pol_w, pol_l], [ref_w, ref_l], beta=cfg.beta, **DPO_SIGMOID
    )
    ids, attn = _rows(2 * b, t)
    inputs = {
        "input_ids": ids,
        "attention_mask": attn,
        "completion_mask": _with_prompt(torch.cat([m_w, m_l])),
    }
    trl_loss = trl._compute_loss(trl.model, inputs, return_outputs=False)
    trl_loss.backward()

    pw, pl = pol_w.clone().requires_grad_(), pol_l.clone().requires_grad_()
    ours = dpo_loss(pw, ref_w, m_w, pl, ref_l, m_l, cfg)
    ours.loss.backward()

    torch.testing.assert_close(ours.loss, trl_loss.detach(), **TOL)
    torch.testing.assert_close(torch.cat([pw.grad, pl.grad]), pol_table.grad, **TOL)
    logged = trl._metrics["train"]
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
        assert ours.metrics[key] == pytest.approx(logged[key][-1], abs=1e-6), key


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_kto_matches_trl(seed):
    g = torch.Generator().manual_seed(seed)
    b, t = 8, 7
    pol, ref, mask = _random(g, b, t)
    # Seeds 0-1: the mismatched pairs lean positive (z0 > 0); 2-3: negative (z0 clamped to 0).
    kl_pol, kl_ref, kl_mask = _random(g, b, t)
    kl_pol = torch.where(kl_mask.bool(), kl_pol + (0.4 if seed < 2 else -0.4), kl_pol)
    labels = torch.tensor([True, False, True, True, False, True, False, False])
    cfg = KTOConfig(beta=0.25, lambda_d=1.1, lambda_u=0.9)

    weights = {"desirable_weight": cfg.lambda_d, "undesirable_weight": cfg.lambda_u}
    trl, pol_table = _on_tables(
        KTOTrainer, [pol, kl_pol], [ref, kl_ref], calculate_KL=True, loss_type="kto",
        beta=cfg.beta, **weights,
    )  # fmt: skip
    ids, attn = _rows(b, t)
    kl_ids, kl_attn = _rows(b, t, offset=b)
    inputs = {
        "input_ids": ids,
        "attention_mask": attn,
        "completion_mask": _with_prompt(mask),
        "KL_input_ids": kl_ids,
        "KL_attention_mask": kl_attn,
        "KL_completion_mask": _with_prompt(kl_mask),
        "label": labels,
    }
    trl_loss = trl._compute_loss(trl.model, inputs, return_outputs=False)
    trl_loss.backward()

    p = pol.clone().requires_grad_()
    ours = kto_loss(p, ref, mask, labels, kl_pol, kl_ref, kl_mask, cfg)
    ours.loss.backward()

    torch.testing.assert_close(ours.loss, trl_loss.detach(), **TOL)
    torch.testing.assert_close(p.grad, pol_table.grad[:b], **TOL)
    assert torch.equal(pol_table.grad[b:], torch.zeros(b, t))  # z0 is detached in both
    logged = trl._metrics["train"]
    assert (ours.metrics["kl"] > 0) == (seed < 2)
    for key in ("kl", "rewards/chosen", "rewards/rejected"):
        assert ours.metrics[key] == pytest.approx(logged[key][-1], abs=1e-6), key


@pytest.mark.parametrize(
    ("seed", "epsilon", "beta_kl", "extra_tokens"),
    [(0, 0.2, 0.0, 0), (1, 0.2, 0.04, 0), (2, 0.5, 0.01, 13), (3, 0.15, 0.1, 5)],
)
def test_grpo_matches_trl_dapo(seed, epsilon, beta_kl, extra_tokens):
    g = torch.Generator().manual_seed(seed)
    b, t = 8, 10
    pol, ref, mask = _random(g, b, t, spread=0.4)
    advantages = torch.randn(b, generator=g)
    # extra_tokens > 0: the batch is one micro-batch of a bigger optimizer batch (DDP/accumulation)
    n_items = mask.sum() + extra_tokens

    pol_table = pol.clone().requires_grad_()
    trl = _bare(
        GRPOTrainer,
        model=FusedHeadStub(pol_table),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=beta_kl,
        loss_type="dapo",
        epsilon_low=epsilon,
        epsilon_high=epsilon,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=1,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
    )
    inputs = {
        "prompt_ids": torch.arange(b)[:, None],
        "prompt_mask": torch.ones(b, 1, dtype=torch.long),
        "completion_ids": torch.zeros(b, t, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": advantages,
        "old_per_token_logps": ref,
        "ref_per_token_logps": ref,
        "num_items_in_batch": n_items,
    }
    trl_loss = trl._compute_loss(trl.model, inputs)
    trl_loss.backward()

    p = pol.clone().requires_grad_()
    ours = grpo_loss(p, ref, mask, advantages, epsilon, beta_kl, token_normalizer=float(n_items))
    ours.loss.backward()

    torch.testing.assert_close(ours.loss, trl_loss.detach(), **TOL)
    torch.testing.assert_close(p.grad, pol_table.grad, **TOL)
    logged = trl._metrics["train"]
    assert ours.metrics["clip_frac"] == pytest.approx(
        logged["clip_ratio/region_mean"][-1], abs=1e-6
    )
    assert 0 < ours.metrics["clip_frac"] < 1  # the ε-clip is exercised, not vacuous
    if beta_kl:
        assert ours.metrics["kl"] == pytest.approx(logged["kl"][-1], abs=1e-6)
