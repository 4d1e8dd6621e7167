"""Math, MATH500-style: n samples per problem, checked with math-verify; pass@1 ± SE,
pass@n, format-reward rate, breakdowns by level and subject, per-item records.

Correctness and format are the trainer's registered reward functions (trainer.rewards:
`math_accuracy`, `format`, `tag_count`), so an evaluation scores answers exactly as online
GRPO rewards them. `math_accuracy` runs math-verify in a bounded child process, so it works off
the main thread too (math-verify's own timeouts use `signal.alarm`, which only works on it).
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

from reports.stats import mean_se, pass_at_1
from trainer.rewards import RewardSpec, combine, extract_answer, format_score, tag_count_score

DEFAULT_PROMPT = (
    "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{}."
)
_BOXED = re.compile(r"\\boxed\s*\{")


class Checked(TypedDict):
    """One sample of a problem, as the result document records it."""

    text: str
    correct: bool
    extracted: str | None
    format: float
    tag_count: float
    boxed: bool
    num_tokens: int | None
    finish_reason: str | None


def has_boxed(completion: str) -> bool:
    return bool(_BOXED.search(completion))


def _text(sample: Any) -> str:
    return sample if isinstance(sample, str) else sample.text


def evaluate_math(
    records: Sequence[dict[str, Any]],
    generate: Callable[..., list[list[Any]]],
    *,
    generation: dict[str, Any] | None = None,
    prompt_template: str = DEFAULT_PROMPT,
    system_prompt: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Run the whole evaluation; returns the result document (JSON-serialisable)."""
    gen = {"n": 4, "temperature": 0.7, "top_p": 0.95, "max_new_tokens": 1024, "seed": 0}
    gen.update(generation or {})
    report = progress or (lambda phase, done, total: None)
    prompts: list[Any] = []
    for r in records:
        # replace, not str.format: a template is user text and must not reach attributes
        user = prompt_template.replace("{problem}", r["problem"])
        prompts.append(
            [{"role": "system", "content": system_prompt}, {"role": "user", "content": user}]
            if system_prompt
            else user
        )
    t0 = time.perf_counter()
    report("generate", 0, len(records))
    samples = generate(prompts, **gen)
    t_gen = time.perf_counter() - t0
    report("generate", len(records), len(records))

    t1 = time.perf_counter()
    texts = [[_text(s) for s in row] for row in samples]
    flat_records = [
        {"answer": r["answer"]} for r, row in zip(records, texts, strict=False) for _ in row
    ]
    flat_texts = [t for row in texts for t in row]
    with combine([RewardSpec(name="math_accuracy")]) as accuracy:
        flat_ok = accuracy([None] * len(flat_texts), flat_texts, flat_records) if flat_texts else []
    items: list[dict[str, Any]] = []
    correct: list[list[bool]] = []
    formatted: list[float] = []
    boxed: list[float] = []
    tokens: list[int] = []
    groups: dict[str, dict[str, list[float]]] = {
        "level": defaultdict(list),
        "subject": defaultdict(list),
    }
    k = 0
    for i, (r, row) in enumerate(zip(records, samples, strict=False)):
        checked: list[Checked] = []
        for s in row:
            text = _text(s)
            checked.append(
                Checked(
                    text=text,
                    correct=bool(flat_ok[k] > 0),
                    extracted=extract_answer(text),
                    format=format_score(text),
                    tag_count=tag_count_score(text),
                    boxed=has_boxed(text),
                    num_tokens=getattr(s, "num_tokens", None),
                    finish_reason=getattr(s, "finish_reason", None),
                )
            )
            k += 1
        row_correct = [c["correct"] for c in checked]
        correct.append(row_correct)
        formatted.append(float(sum(c["format"] for c in checked) / max(len(checked), 1)))
        boxed.append(float(sum(c["boxed"] for c in checked) / max(len(checked), 1)))
        tokens.extend(c["num_tokens"] for c in checked if c["num_tokens"] is not None)
        p1 = float(sum(row_correct) / max(len(row_correct), 1))
        for key in ("level", "subject"):
            if r.get(key) is not None:
                groups[key][str(r[key])].append(p1)
        items.append(
            {
                "index": i,
                "problem": r["problem"],
                "answer": r["answer"],
                "level": r.get("level"),
                "subject": r.get("subject"),
                "pass_at_1": p1,
                "samples": checked,
            }
        )
    report("verify", len(records), len(records))
    t_verify = time.perf_counter() - t1

    metrics = {
        "pass_at_1": pass_at_1(correct).as_dict(),
        "pass_at_n": mean_se([float(any(row)) for row in correct]).as_dict(),
        "format_rate": mean_se(formatted).as_dict(),
        "boxed_rate": mean_se(boxed).as_dict(),
        "avg_tokens": mean_se(tokens).value,
        "n_items": len(records),
        "n_samples": int(gen["n"]),
    }
    breakdown = {
        key: {name: mean_se(v).as_dict() for name, v in sorted(by.items())}
        for key, by in groups.items()
        if by
    }
    return {
        "kind": "math",
        "metrics": metrics,
        "breakdown": breakdown,
        "generation": gen,
        "prompt_template": prompt_template,
        "system_prompt": system_prompt,
        "timing": {"generate_s": t_gen, "verify_s": t_verify},
        "items": items,
    }
