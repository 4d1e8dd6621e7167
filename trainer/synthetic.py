"""Small, deterministic preference data the repo generates itself (demo and tests).

Arithmetic and short instruction prompts; the chosen answer is correct and helpful, the
rejected one wrong or curt. Nothing is downloaded. Torch-free.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

_TOPICS = ["the ocean", "a library", "autumn", "bicycles", "the moon", "coffee", "rivers", "robots"]
_FORMS = ["Write one sentence about {t}.", "Describe {t} briefly.", "Give a fun fact about {t}."]


def _arith(rng: random.Random) -> dict:
    a, b = rng.randint(2, 49), rng.randint(2, 49)
    op = rng.choice(["+", "-", "*"])
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    wrong = value + rng.choice([-3, -2, -1, 1, 2, 3])
    return {
        "prompt": f"What is {a} {op} {b}?",
        "chosen": f"{a} {op} {b} = {value}. The answer is {value}.",
        "rejected": f"The answer is {wrong}.",
        "answer": str(value),
    }


def _instruction(rng: random.Random) -> dict:
    topic = rng.choice(_TOPICS)
    return {
        "prompt": rng.choice(_FORMS).format(t=topic),
        "chosen": f"Here is a thought about {topic}: it is full of small surprises worth noticing.",
        "rejected": "No.",
    }


def preference_records(n: int, seed: int = 0) -> list[dict]:
    """n {prompt, chosen, rejected} records, half arithmetic, half instructions."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        rec = _arith(rng) if i % 2 == 0 else _instruction(rng)
        rec.pop("answer", None)
        out.append(rec)
    return out


def unpaired_records(n: int, seed: int = 0) -> list[dict]:
    """n {prompt, completion, label} records, alternating desirable and undesirable."""
    out = []
    for _i, rec in enumerate(preference_records((n + 1) // 2, seed)):
        out.append({"prompt": rec["prompt"], "completion": rec["chosen"], "label": True})
        out.append({"prompt": rec["prompt"], "completion": rec["rejected"], "label": False})
    return out[:n]


def sft_records(n: int, seed: int = 0) -> list[dict]:
    """n SFT records in OpenAI's chat format (the preferred answers as assistant turns): a third
    one exchange, a third two learned exchanges, a third two exchanges whose first answer has
    weight 0 (context); every other one opens with a system turn."""
    pairs = preference_records(2 * n, seed)
    out = []
    for i in range(n):
        a, b = pairs[2 * i], pairs[2 * i + 1]
        messages = [{"role": "user", "content": a["prompt"]}]
        if i % 3:
            first = {"role": "assistant", "content": a["chosen"]}
            if i % 3 == 2:
                first = {"role": "assistant", "content": a["rejected"], "weight": 0}
            messages += [first, {"role": "user", "content": b["prompt"]}]
            answer = b["chosen"]
        else:
            answer = a["chosen"]
        if i % 2:
            messages.insert(0, {"role": "system", "content": "You are a helpful assistant."})
        out.append({"messages": messages + [{"role": "assistant", "content": answer}]})
    return out


def write_jsonl(path: str | Path, records: list[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# Held-out instruction prompts for the demo's evaluation (examples/data/instruction_eval_demo.jsonl,
# written by trainer.evaluation.demo_set): the families above, never a prompt of the bundled
# preference files (new topics; arithmetic pairs drawn until unseen).
_EVAL_TOPICS = ["the desert", "trains", "music", "a garden", "the rain", "bread", "mountains",
                "owls"]  # fmt: skip


def eval_prompts(n: int, seed: int = 11, exclude: frozenset[str] = frozenset()) -> list[str]:
    """n distinct prompts, alternating arithmetic and instructions, none in `exclude`."""
    rng = random.Random(seed)
    pool = [form.format(t=t) for t in _EVAL_TOPICS for form in _FORMS]
    rng.shuffle(pool)
    out: list[str] = []
    seen = set(exclude)
    while len(out) < n:
        if len(out) % 2 == 0:
            prompt = _arith(rng)["prompt"]
        elif pool:
            prompt = pool.pop()
        else:
            raise ValueError(f"only {len(out)} distinct prompts; ask for fewer")
        if prompt not in seen:
            seen.add(prompt)
            out.append(prompt)
    return out
