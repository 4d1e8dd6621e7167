"""The generated arithmetic prompt set: reproducible, valid, correct, and train/eval disjoint."""

import ast
import operator
import re
from fractions import Fraction

import pytest

from contract.data import EVAL_FORMATS, read_jsonl
from trainer import prompts

TRAIN = prompts.DATA_DIR / "arithmetic_train.jsonl"
EVAL = prompts.DATA_DIR / "arithmetic_eval.jsonl"

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def evaluate(expr: str) -> Fraction:
    """An independent exact evaluator for "What is <expr>?" questions (precedence from ast)."""

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return Fraction(node.value)
        raise ValueError(f"unexpected syntax in {expr!r}")

    return walk(ast.parse(expr, mode="eval").body)


def independent_answer(question: str) -> Fraction | None:
    """Re-derive the answer from the question text alone; None for word problems."""
    if m := re.fullmatch(r"What is (\d+)% of (\d+)\?", question):
        return Fraction(int(m[1]) * int(m[2]), 100)
    if m := re.fullmatch(r"What is ([\d +\-*/]+)\?", question):
        return evaluate(m[1])
    if m := re.search(r"has (\d+) \w+, buys (\d+) more and gives (\d+) away", question):
        return Fraction(int(m[1]) + int(m[2]) - int(m[3]))
    if m := re.search(r"packs (\d+) boxes with (\d+) ", question):
        return Fraction(int(m[1]) * int(m[2]))
    if m := re.search(r"shares (\d+) \w+ equally among (\d+) friends", question):
        return Fraction(int(m[1]), int(m[2]))
    return None


def test_committed_files_are_what_the_generator_writes():
    assert TRAIN.read_text() == prompts.to_jsonl(prompts.train_records())
    assert EVAL.read_text() == prompts.to_jsonl(prompts.eval_records())


def test_generation_is_deterministic_and_seeded(tmp_path):
    prompts.write(tmp_path)
    assert (tmp_path / "arithmetic_train.jsonl").read_bytes() == TRAIN.read_bytes()
    assert prompts.train_records(seed=1) != prompts.train_records(seed=2)


def test_files_pass_upload_validation_in_the_right_formats():
    fmt, train = read_jsonl(str(TRAIN))
    assert fmt == "prompt" and len(train) == prompts.TRAIN_SIZE == 256
    assert train[0]["prompt"][0] == {"role": "system", "content": prompts.SYSTEM_PROMPT}
    assert "<think>" in prompts.SYSTEM_PROMPT and "<answer>" in prompts.SYSTEM_PROMPT
    fmt, evals = read_jsonl(str(EVAL), allowed=EVAL_FORMATS)
    assert fmt == "eval_math" and len(evals) == prompts.EVAL_SIZE == 64
    assert {"problem", "answer", "level", "subject"} <= set(evals[0])


@pytest.mark.parametrize(
    "records",
    [prompts.train_records, prompts.eval_records],
    ids=["train", "eval"],
)
def test_every_answer_is_right(records):
    for r in records():
        question = r["prompt"][-1]["content"] if "prompt" in r else r["problem"]
        expected = independent_answer(question)
        assert expected is not None, f"no independent check for {question!r}"
        assert r["answer"] == prompts.format_answer(expected), question


def test_mix_covers_every_generator_and_level():
    records = prompts.train_records()
    assert {r["subject"] for r in records} == {
        "arithmetic",
        "fractions",
        "percentages",
        "word problems",
    }
    assert {r["level"] for r in records} == {1, 2, 3}
    assert any(r["answer"].startswith("-") for r in records)
    assert any("/" in r["answer"] for r in records)


def test_no_duplicates_and_eval_disjoint_from_train():
    train_q = [r["prompt"][-1]["content"] for r in prompts.train_records()]
    eval_q = [r["problem"] for r in prompts.eval_records()]
    assert len(set(train_q)) == len(train_q) and len(set(eval_q)) == len(eval_q)
    assert not set(train_q) & set(eval_q)


def test_answer_formatting():
    assert prompts.format_answer(Fraction(12)) == "12"
    assert prompts.format_answer(Fraction(-6, 4)) == "-3/2"


def test_a_perfect_completion_earns_the_full_math_reward():
    from trainer.rewards import MATH_REWARDS, combine

    records = prompts.train_records()
    completions = [f"<think>work</think>\n<answer>{r['answer']}</answer>" for r in records]
    wrong = [f"<think>work</think><answer>{r['answer']}1</answer>" for r in records]
    with combine(MATH_REWARDS) as reward:
        right_totals, _ = reward.score([r["prompt"] for r in records], completions, records)
        wrong_totals, _ = reward.score([r["prompt"] for r in records], wrong, records)
    assert right_totals == [10.0] * len(records)
    assert wrong_totals == [2.0] * len(records)
