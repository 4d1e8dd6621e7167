"""benchmarks/testbed.py's task (issue 28): two-operand addition drawn by a fixed RNG (train
and held-out disjoint), the task tokenizer (every digit one token) and the random Llama the
base policy is trained from. `setup` is testbed.Setup."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any


# ---- the task ------------------------------------------------------------------------------
def make_task(setup: Any, out: Path) -> dict[str, Path]:
    """Deterministic: sft (prompt/completion), grpo (prompt/answer), held-out (problem/answer)."""
    from trainer import prompts

    rng = random.Random(28)
    da, db = setup.digits
    seen: set[tuple[int, int]] = set()
    rows: list[tuple[str, str]] = []
    while len(rows) < 2 * setup.train_size + setup.eval_size:
        a, b = (rng.randint(10 ** (d - 1), 10**d - 1) for d in (da, db))
        if (a, b) not in seen:
            seen.add((a, b))
            rows.append((f"{a}+{b}=", str(a + b)))
    held = rows[: setup.eval_size]
    sft = rows[setup.eval_size : setup.eval_size + setup.train_size]
    grpo = rows[setup.eval_size + setup.train_size :]
    paths = {k: out / f"addition_{k}.jsonl" for k in ("sft", "grpo", "heldout")}
    paths["sft"].write_text(prompts.to_jsonl([{"prompt": q, "completion": a} for q, a in sft]))
    paths["grpo"].write_text(prompts.to_jsonl(
        [{"prompt": [{"role": "user", "content": q}], "answer": a} for q, a in grpo]
    ))  # fmt: skip
    paths["heldout"].write_text(prompts.to_jsonl([{"problem": q, "answer": a} for q, a in held]))
    return paths


def task_tokenizer(setup: Any) -> Any:
    """A byte-level BPE trained on the task's own chat-formatted text, every digit its own
    token. The repo's 512-token tiny tokenizer splits numbers into shifting 1-2 digit chunks
    (121 → 12|1, 347 → 3|47), so a digit's place is a different token at a different position
    from sum to sum; the SFT base then plateaued below 2% (docs/replication.md, builds 1-3)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from trainer.modeling.sources import _CHATML

    rng = random.Random(280)
    da, db = setup.digits
    corpus = [
        f"<|im_start|>user\n{rng.randint(10 ** (da - 1), 10**da - 1)}+"
        f"{rng.randint(10 ** (db - 1), 10**db - 1)}=<|im_end|>\n<|im_start|>assistant\n"
        f"{rng.randint(1, 10 ** (da + 1))}<|im_end|>\n"
        for _ in range(500)
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    ))  # fmt: skip
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>"
    )
    fast.chat_template = _CHATML
    return fast


def make_model(setup: Any, out: Path) -> Path:
    from trainer.modeling.sources import save_random_llama

    tok = task_tokenizer(setup)
    shape = {"vocab_size": len(tok), "hidden_size": setup.hidden,
             "intermediate_size": 4 * setup.hidden, "num_hidden_layers": setup.layers,
             "num_attention_heads": setup.heads, "num_key_value_heads": setup.heads,
             "tie_word_embeddings": True}  # fmt: skip
    save_random_llama(out, shape, tok, seed=28, max_position_embeddings=64)
    return out
