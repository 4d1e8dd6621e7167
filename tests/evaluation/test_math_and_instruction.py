"""The math and instruction evaluations with scripted generators and judges whose answers are
known, plus a slow end-to-end check with SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from contract.data import read_jsonl
from trainer.evaluation.generation import Sample
from trainer.evaluation.instruction import evaluate_instructions
from trainer.evaluation.judges import Judgement, Pair, RewardModelJudge
from trainer.evaluation.math import DEFAULT_PROMPT, evaluate_math

REPO = Path(__file__).resolve().parents[2]
MATH_SET = REPO / "examples" / "data" / "math_eval_small.jsonl"
INSTRUCTION_SET = REPO / "examples" / "data" / "instruction_eval_small.jsonl"


def _records(path: Path, fmt: str) -> list[dict]:
    got, records = read_jsonl(str(path), allowed=(fmt,))
    assert got == fmt
    return records


class ScriptedMath:
    """Problem i: every sample right (i % 3 == 0), the first of each pair right (i % 3 == 1),
    all wrong (i % 3 == 2). Right answers alternate \\boxed{} and <think>/<answer> layouts."""

    def __init__(self, records):
        self.records = records
        self.calls = []

    def __call__(self, prompts, *, n, temperature, top_p, max_new_tokens, seed):
        self.calls.append({"n": n, "temperature": temperature, "prompts": prompts})
        out = []
        for prompt in prompts:
            text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
            i = next(k for k, r in enumerate(self.records) if r["problem"] in text)
            answer = self.records[i]["answer"]
            row = []
            for j in range(n):
                right = i % 3 == 0 or (i % 3 == 1 and j % 2 == 0)
                value = answer if right else "123456"
                if j % 2 == 0:
                    row.append(
                        Sample(f"Let me think. The answer is \\boxed{{{value}}}.", 12, "stop")
                    )
                else:
                    row.append(
                        Sample(f"<think>work it out</think>\n<answer>{value}</answer>", 9, "stop")
                    )
            out.append(row)
        return out


def test_math_eval_scores_a_scripted_generator_exactly():
    records = _records(MATH_SET, "eval_math")
    gen = ScriptedMath(records)
    doc = evaluate_math(records, gen, generation={"n": 4, "temperature": 0.7, "max_new_tokens": 64})
    per_problem = [1.0 if i % 3 == 0 else 0.5 if i % 3 == 1 else 0.0 for i in range(len(records))]
    m = doc["metrics"]
    assert m["pass_at_1"]["value"] == pytest.approx(np.mean(per_problem))
    assert m["pass_at_1"]["se"] == pytest.approx(
        np.std(per_problem, ddof=1) / np.sqrt(len(records))
    )
    assert m["pass_at_n"]["value"] == pytest.approx(np.mean([p > 0 for p in per_problem]))
    assert m["format_rate"]["value"] == pytest.approx(0.5)  # odd samples use the tags
    assert m["boxed_rate"]["value"] == pytest.approx(0.5)
    assert (
        m["n_items"] == len(records)
        and m["n_samples"] == 4
        and m["avg_tokens"] == pytest.approx(10.5)
    )
    assert [it["pass_at_1"] for it in doc["items"]] == per_problem
    first = doc["items"][0]["samples"]
    assert first[0]["correct"] and first[0]["extracted"] == records[0]["answer"]
    assert first[1]["format"] == 1.0 and first[1]["tag_count"] == 1.0
    # breakdown by level and subject
    levels = {r["level"] for r in records}
    assert set(doc["breakdown"]["level"]) == levels
    lvl1 = [p for p, r in zip(per_problem, records, strict=True) if r["level"] == "1"]
    assert doc["breakdown"]["level"]["1"]["value"] == pytest.approx(np.mean(lvl1))
    # the prompt: the problem in the default template, one user turn
    assert gen.calls[0]["prompts"][0] == DEFAULT_PROMPT.replace("{problem}", records[0]["problem"])
    json.dumps(doc)  # serialisable as is


def _verdicts(records, samples):
    def gen(prompts, **kw):
        return [[Sample(t, 3, "stop") for t in row] for row in samples]

    doc = evaluate_math(records, gen, generation={"n": len(samples[0])})
    return [[s["correct"] for s in it["samples"]] for it in doc["items"]]


def test_math_eval_checks_latex_answers_symbolically():
    records = [{"problem": "half?", "answer": "\\frac{1}{2}"}, {"problem": "sum?", "answer": "11"}]
    samples = [
        ["\\boxed{0.5}", "\\boxed{\\frac{2}{4}}", "\\boxed{\\frac{1}{3}}"],
        ["so \\boxed{11}", "<answer>11</answer>", "\\boxed{12}"],
    ]
    assert _verdicts(records, samples) == [[True, True, False], [True, True, False]]


def test_math_eval_checks_latex_products_symbolically():
    """Gold '5\\sqrt{2}' must not read as its first number, 5."""
    records = [{"problem": "root?", "answer": "5\\sqrt{2}"}]
    assert _verdicts(records, [["\\boxed{\\sqrt{50}}", "\\boxed{5}"]]) == [[True, False]]


def test_math_eval_system_prompt_and_template():
    records = _records(MATH_SET, "eval_math")[:2]
    gen = ScriptedMath(records)
    evaluate_math(
        records,
        gen,
        generation={"n": 1},
        prompt_template="Q: {problem} A:",
        system_prompt="Answer in <answer> tags.",
    )
    prompt = gen.calls[0]["prompts"][0]
    assert prompt[0] == {"role": "system", "content": "Answer in <answer> tags."}
    assert prompt[1]["content"] == f"Q: {records[0]['problem']} A:"


# --- instruction following -----------------------------------------------------------------------


class LengthJudge:
    """Prefers the longer answer, whatever it says."""

    name = "length"

    def __init__(self):
        self.seen: list[Pair] = []

    def judge(self, pairs):
        self.seen.extend(pairs)
        return [
            Judgement("A" if len(p.a) > len(p.b) else "B" if len(p.b) > len(p.a) else "tie", "x")
            for p in pairs
        ]


def test_instruction_eval_judges_both_orders_and_reports_lengths():
    records = [{"instruction": f"q{i}", "output": "r" * (10 + i)} for i in range(6)]
    answers = ["m" * n for n in (5, 30, 8, 40, 1, 50)]  # longer than the reference for 1, 3, 5

    def gen(prompts, **kw):
        assert kw["n"] == 1 and kw["temperature"] == 0.0
        return [[Sample(answers[int(p[1:])], len(answers[int(p[1:])]), "stop")] for p in prompts]

    judge = LengthJudge()
    doc = evaluate_instructions(records, gen, judge)
    assert len(judge.seen) == 12
    assert judge.seen[0] == Pair("q0", answers[0], records[0]["output"])  # model first
    assert judge.seen[1] == Pair("q0", records[0]["output"], answers[0])  # reference first
    m = doc["metrics"]
    assert m["win_rate"]["value"] == pytest.approx(0.5)
    assert m["avg_length"] == pytest.approx(np.mean([len(a) for a in answers]))
    assert m["avg_reference_length"] == pytest.approx(np.mean([10 + i for i in range(6)]))
    assert m["order_agreement"] == 1.0 and m["first_position_rate"] == pytest.approx(0.5)
    assert [it["score"] for it in doc["items"]] == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    item = doc["items"][1]
    assert item["output"] == answers[1] and item["reference"] == records[1]["output"]
    assert [j["order"] for j in item["judgements"]] == ["model_first", "reference_first"]
    assert [j["verdict"] for j in item["judgements"]] == ["A", "B"]  # the longer (model) both times


def test_instruction_eval_length_bias_is_removed_by_lc():
    rng = np.random.default_rng(0)
    n = 400
    ref_len = rng.integers(200, 1200, n)
    model_len = (ref_len * rng.lognormal(0.3, 0.4, n)).astype(int)
    records = [{"instruction": f"q{i}", "output": "r" * int(ref_len[i])} for i in range(n)]

    def gen(prompts, **kw):
        return [[Sample("m" * int(model_len[int(p[1:])]), 1, "stop")] for p in prompts]

    class NoisyLengthJudge:
        name = "noisy-length"

        def judge(self, pairs):
            out = []
            for p in pairs:
                d = (len(p.a) - len(p.b)) / 400
                out.append(
                    Judgement("A" if rng.random() < 1 / (1 + np.exp(-3 * np.tanh(d))) else "B", "")
                )
            return out

    doc = evaluate_instructions(records, gen, NoisyLengthJudge())
    raw, lc = doc["metrics"]["win_rate"], doc["metrics"]["lc_win_rate"]
    assert raw["value"] > 0.65
    assert abs(lc["value"] - 0.5) < 3 * lc["se"]
    assert doc["lc_fit"]["coef"]["length"] > 1


def test_instruction_eval_with_the_reward_model_judge(reward_model_dir):
    records = _records(INSTRUCTION_SET, "eval_instruction")

    def gen(prompts, **kw):
        return [[Sample(f"My answer to: {p}", 5, "stop")] for p in prompts]

    doc = evaluate_instructions(records, gen, RewardModelJudge(reward_model_dir))
    assert doc["metrics"]["n_items"] == len(records) and doc["metrics"]["unparsed"] == 0
    assert doc["metrics"]["order_agreement"] == 1.0  # a reward model has no position bias
    assert doc["judge"]["name"].startswith("reward_model:")


@pytest.mark.slow
def test_smollm2_solves_some_easy_arithmetic():
    from trainer.evaluation.generation import Generator

    records = [r for r in _records(MATH_SET, "eval_math") if r["level"] == "1"]
    generator = Generator.from_source({"type": "base", "name": "smollm2-135m-instruct"})
    doc = evaluate_math(
        records,
        generator.generate,
        generation={"n": 2, "temperature": 0.7, "max_new_tokens": 96, "seed": 0},
    )
    p1 = doc["metrics"]["pass_at_1"]
    assert 0 < p1["value"] <= 1, p1
    assert all(len(it["samples"]) == 2 for it in doc["items"])
