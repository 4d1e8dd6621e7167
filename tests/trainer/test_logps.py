"""Log-probs with a shared prompt prefix equal the plain one-pass log-probs, values and gradients.

Rows sharing a prompt (DPO pairs, GRPO groups) run the prompt once and attend to its cached
keys and values (trainer.tokenize.SharedPrefix). The one-pass batch of the same sequences is
the independent reference: every completion token's log-prob and every weight's gradient must
agree, for full fine-tuning and LoRA, with prompts and completions of unequal lengths.
"""

from __future__ import annotations

import pytest
import torch

from tests.trainer.conftest import moved_policy
from trainer.logps import token_logps
from trainer.tokenize import TokenSeq, collate

PAD = 0


def _seqs() -> list[TokenSeq]:
    gen = torch.Generator().manual_seed(0)
    ids = lambda n: tuple(int(t) for t in torch.randint(3, 500, (n,), generator=gen))  # noqa: E731
    p1, p2, p3 = ids(9), ids(4), ids(13)
    # a DPO-like layout (all chosen, then all rejected) plus a group of three and a loner
    return [
        TokenSeq(p1, ids(5)),
        TokenSeq(p2, ids(11)),
        TokenSeq(p1, ids(8)),
        TokenSeq(p2, ids(2)),
        TokenSeq(p3, ids(6)),
        TokenSeq(p3, ids(1)),
        TokenSeq(p3, ids(7)),
        TokenSeq(ids(6), ids(3)),
    ]


def _completion_logps(lp: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Each row's completion-token log-probs in order, whatever the batch layout."""
    return [row[m > 0] for row, m in zip(lp, mask, strict=False)]


def _model(adapter: str) -> torch.nn.Module:
    if adapter == "none":
        return moved_policy(kind="none")
    return moved_policy(kind="lora", r=4, alpha=8)


def test_collate_shares_each_repeated_prompt_once():
    seqs = _seqs()
    batch = collate(seqs, PAD)
    assert batch.prefix is not None
    assert batch.prefix.input_ids.shape[0] == 4  # p1, p2, p3, the loner
    assert batch.prefix.index.tolist() == [0, 1, 0, 1, 2, 2, 2, 3]
    assert batch.prefix.lengths.tolist() == [8, 3, 8, 3, 12, 12, 12, 5]
    assert batch.seq_tokens == sum(len(s.prompt_ids) + len(s.completion_ids) for s in seqs)
    assert batch.num_tokens == sum(len(s.completion_ids) for s in seqs)
    plain = collate(seqs, PAD, share_prompts=False)
    assert plain.prefix is None and plain.seq_tokens == batch.seq_tokens
    assert plain.num_tokens == batch.num_tokens


def test_unique_or_one_token_prompts_are_not_shared():
    assert collate([TokenSeq((5, 6), (7,)), TokenSeq((8, 9), (7,))], PAD).prefix is None
    assert collate([TokenSeq((5,), (7,)), TokenSeq((5,), (8,))], PAD).prefix is None


@pytest.mark.parametrize("adapter", ["none", "lora"])
def test_shared_prefix_matches_one_pass_values_and_gradients(adapter):
    model = _model(adapter)
    seqs = _seqs()
    results = []
    for share in (True, False):
        batch = collate(seqs, PAD, share_prompts=share)
        assert (batch.prefix is not None) is share
        model.zero_grad(set_to_none=True)
        per_row = _completion_logps(token_logps(model, batch), batch.mask)
        # every token weighed differently, so tokens scored at the wrong place cannot cancel
        loss = sum((r * torch.linspace(0.5, 1.5, len(r))).sum() for r in per_row)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        results.append(([r.detach() for r in per_row], grads))
    (shared, g_shared), (plain, g_plain) = results
    for a, b in zip(shared, plain, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)
    assert g_shared.keys() == g_plain.keys()
    for name in g_plain:
        torch.testing.assert_close(g_shared[name], g_plain[name], rtol=1e-4, atol=1e-6, msg=name)


def test_shared_prefix_scores_the_same_without_grad():
    model = _model("none").eval()
    seqs = _seqs()
    with torch.no_grad():
        shared = token_logps(model, collate(seqs, PAD))
        plain = token_logps(model, collate(seqs, PAD, share_prompts=False))
    s = _completion_logps(shared, collate(seqs, PAD).mask)
    p = _completion_logps(plain, collate(seqs, PAD, share_prompts=False).mask)
    for a, b in zip(s, p, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)
