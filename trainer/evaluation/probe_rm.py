"""A reward model fitted in seconds from preference pairs: a linear Bradley-Terry head on a
frozen base model's pooled features, saved as a sequence-classification checkpoint that
`judges.RewardModelJudge` loads (an operator names its directory in EVAL_REWARD_MODELS).

    fit_probe_reward_model("tiny-llama", pairs, out_dir) -> out_dir

Why: `make demo` needs a judge with no network and a few seconds of CPU. The bundled chat
judge (tools/openai_server over SmolLM2-135M) answers "A" to every pair, so every item ties
in the two orders and the win rate is a vacuous 0.5 ± 0. This judge instead learns what the
preference data prefers (P(chosen ≻ rejected) = σ(w·(h_chosen − h_rejected)), L2-penalised
maximum likelihood), so it rewards the *form* of the chosen answers and nothing the data does
not show: a demo judge, not a general one (tiny-llama's features are random).

Features are what the saved model computes: the sequence classifier's pooled hidden state (the
last non-pad token; transformers' own pooling, through an identity head), over the same text
RewardModelJudge scores (the chat template of the instruction and the answer), so the saved
model's score is exactly w·h. Its scale is arbitrary; the judge compares two scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from trainer.modeling import resolve_model


def _classifier(base_dir: Path, num_labels: int) -> tuple[Any, Any]:
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForSequenceClassification.from_pretrained(
        base_dir, num_labels=num_labels, pad_token_id=tokenizer.pad_token_id
    )
    model.eval()
    return model, tokenizer


def _text(tokenizer: Any, instruction: str, answer: str) -> str:
    # RewardModelJudge._text: the two must render the same string
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": instruction}, {"role": "assistant", "content": answer}],
            tokenize=False,
        )
    return f"{instruction}\n\n{answer}"


def pooled_features(
    model: Any, tokenizer: Any, items: Sequence[tuple[str, str]], batch_size: int = 32
) -> torch.Tensor:
    """(len(items), hidden) float64: the classifier's pooled state per (instruction, answer);
    `model`'s head must be the identity (num_labels = hidden size)."""
    out = []
    with torch.no_grad():
        for s in range(0, len(items), batch_size):
            enc = tokenizer(
                [_text(tokenizer, i, a) for i, a in items[s : s + batch_size]],
                return_tensors="pt",
                padding=True,
                add_special_tokens=False,
            )
            out.append(model(**enc).logits.double())
    return torch.cat(out) if out else torch.zeros(0, model.config.hidden_size, dtype=torch.double)


def fit_bradley_terry(diffs: torch.Tensor, l2: float = 1.0) -> torch.Tensor:
    """w maximising Σ log σ(w·d) − l2/2 |w|² over rows d = h_chosen − h_rejected, on
    standardised features (the returned w is in the raw units: score = w·h). Convex: L-BFGS."""
    diffs = diffs.double()
    std = diffs.std(dim=0) if len(diffs) > 1 else torch.zeros(diffs.shape[1], dtype=torch.double)
    scale = torch.where(std > 1e-12, std, torch.ones_like(std))  # a constant feature: as is
    x = diffs / scale
    w = torch.zeros(x.shape[1], dtype=torch.double, requires_grad=True)
    opt = torch.optim.LBFGS(
        [w],
        max_iter=500,
        tolerance_grad=1e-10,
        tolerance_change=1e-14,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.softplus(-(x @ w)).sum() + 0.5 * l2 * (w @ w)
        loss.backward()
        return loss

    opt.step(closure)
    return (w / scale).detach()


def fit_probe_reward_model(
    base_model: str, pairs: Sequence[dict[str, str]], out_dir: Path, *, l2: float = 1.0
) -> Path:
    """Fit on `pairs` ({"prompt", "chosen", "rejected"} strings) and save the classifier and
    its tokenizer into `out_dir`; returns it."""
    if not pairs:
        raise ValueError("fitting a reward model needs at least one preference pair")
    base_dir = resolve_model(base_model)
    torch.manual_seed(0)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # "score.weight newly initialised": we set it
    try:
        return _fit(base_dir, pairs, Path(out_dir), l2)
    finally:
        transformers.logging.set_verbosity(verbosity)


def _fit(base_dir: Path, pairs: Sequence[dict[str, str]], out_dir: Path, l2: float) -> Path:
    hidden = AutoConfig.from_pretrained(base_dir).hidden_size
    probe, tokenizer = _classifier(base_dir, num_labels=hidden)
    with torch.no_grad():
        probe.score.weight.copy_(torch.eye(hidden))
    chosen = pooled_features(probe, tokenizer, [(p["prompt"], p["chosen"]) for p in pairs])
    rejected = pooled_features(probe, tokenizer, [(p["prompt"], p["rejected"]) for p in pairs])
    w = fit_bradley_terry(chosen - rejected, l2)

    model, _ = _classifier(base_dir, num_labels=1)
    with torch.no_grad():
        model.score.weight.copy_(w.to(model.score.weight.dtype)[None, :])
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
