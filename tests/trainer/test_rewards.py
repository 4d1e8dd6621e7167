"""Reward sources: the math verifier, the format rules, a reward model, and their combination."""

import subprocess
import sys
import threading

import pytest

from trainer.rewards import (
    MATH_REWARDS,
    REWARDS,
    RewardSpec,
    combine,
    extract_answer,
    format_score,
    tag_count_score,
)
from trainer.rewards.string_check import StringCheck
from trainer.rewards.verifier import MathAccuracy

# (completion, gold answer, expected reward). Grouped: integers, negatives, fractions, LaTeX,
# \boxed{}, units, percentages, thousands/decimals, wrong/empty/garbage, answer tags.
VERIFIER_CASES = [
    ("<answer>42</answer>", "42", 1),
    ("<answer>41</answer>", "42", 0),
    ("The answer is 42.", "42", 1),
    ("First 40, then 2 more: 42", "42", 1),
    ("I think 42 ... no wait, 43", "42", 0),
    ("<answer>-7</answer>", "-7", 1),
    ("<answer>7</answer>", "-7", 0),
    ("<answer>−7</answer>", "-7", 1),
    ("so x = -12", "-12", 1),
    ("<answer>1/2</answer>", "0.5", 1),
    ("<answer>0.5</answer>", "1/2", 1),
    ("<answer>\\frac{1}{2}</answer>", "1/2", 1),
    ("<answer>\\dfrac{1}{2}</answer>", "0.5", 1),
    ("<answer>2/4</answer>", "1/2", 1),
    ("<answer>1/3</answer>", "0.33", 0),
    ("<answer>-5/6</answer>", "-5/6", 1),
    ("<answer>5/6</answer>", "-5/6", 0),
    ("<answer>$12$</answer>", "12", 1),
    ("<answer>\\(12\\)</answer>", "12", 1),
    ("so the answer is \\boxed{42}.", "42", 1),
    ("\\boxed{41} hmm", "42", 0),
    ("first \\boxed{1} then \\boxed{\\frac{3}{4}}", "0.75", 1),
    ("<answer>\\boxed{9}</answer>", "9", 1),
    ("\\boxed{-3} and later 99", "-3", 1),
    ("<answer>5 cm</answer>", "5", 1),
    ("<answer>5\\text{ cm}</answer>", "5", 1),
    ("<answer>12 apples</answer>", "12", 1),
    ("<answer>\\$12</answer>", "12", 1),
    ("<answer>50%</answer>", "50", 1),
    ("<answer>50\\%</answer>", "50", 1),
    ("<answer>25%</answer>", "50", 0),
    ("<answer>1,000</answer>", "1000", 1),
    ("It costs 1,234 dollars", "1234", 1),
    ("<answer>5.0</answer>", "5", 1),
    ("<answer>5.01</answer>", "5", 0),
    ("", "5", 0),
    ("asdf qwerty", "5", 0),
    ("<answer></answer>", "5", 0),
    ("<answer>five</answer>", "5", 0),
    ("<think>5</think><answer>6</answer>", "5", 0),
    ("<answer>5</answer> wait no <answer>6</answer>", "6", 1),
    ("<answer>5", "5", 1),
    ("<answer>x = 4</answer>", "4", 1),
    ("<answer>" + "blah " * 50 + "so 17</answer>", "17", 1),
    ("<answer>23/131</answer>", "$\\frac{23}{131}$", 1),
    ("<answer>-24</answer>", "-24", 1),
    ("<answer>$3 \\times 4$</answer>", "12", 1),
]


@pytest.fixture(scope="module")
def accuracy():
    fn = MathAccuracy()
    yield fn
    fn.close()


def score_one(fn, completion: str, answer: str) -> float:
    return fn(["q"], [completion], [{"answer": answer}])[0]


@pytest.mark.parametrize(("completion", "answer", "expected"), VERIFIER_CASES)
def test_verifier_table(accuracy, completion, answer, expected):
    assert score_one(accuracy, completion, answer) == float(expected)


def test_verifier_table_is_broad():
    assert len(VERIFIER_CASES) >= 30
    assert sum(e for *_, e in VERIFIER_CASES) < len(VERIFIER_CASES) - 10  # many negatives


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<answer> 12 </answer>", "12"),
        ("<answer>1</answer><answer>2</answer>", "2"),  # the last tag
        ("<answer>\\boxed{3}</answer> 9", "\\boxed{3}"),  # tags beat everything else
        ("\\boxed{\\frac{1}{2}} and 7", "\\frac{1}{2}"),  # nested braces, boxed beats numbers
        ("\\boxed{unclosed 4", "4"),
        ("compute 10-3", "3"),  # a minus after a digit is an operator, not a sign
        ("x = -3", "-3"),
        ("x = −3", "-3"),  # unicode minus
        ("total 1,234,567 coins", "1,234,567"),
        ("half is 3 / 6", "3 / 6"),
        ("no digits here", None),
        ("<answer>   </answer> 5", None),  # an empty answer tag is an empty answer
        ("<answer>" + "x" * 300 + "</answer>", None),  # long prose without a number
    ],
)
def test_extract_answer(completion, expected):
    assert extract_answer(completion) == expected


def test_verifier_works_off_the_main_thread(accuracy):
    results: list = []
    worker = threading.Thread(
        target=lambda: results.append(
            accuracy(
                ["q", "q"],
                ["<answer>1/2</answer>", "<answer>3</answer>"],
                [{"answer": "0.5"}, {"answer": "4"}],
            )
        )
    )
    worker.start()
    worker.join(timeout=60)
    assert results == [[1.0, 0.0]]


def test_runaway_answer_is_killed_and_the_verifier_recovers():
    fn = MathAccuracy(timeout_s=1.0)
    try:
        # sympy never finishes evaluating this tower; math-verify's own timeout is off.
        bomb = "<answer>$9^{9^{9^{9}}}$</answer>"
        scores = fn(
            ["q"] * 3, ["<answer>5</answer>", bomb, "<answer>5</answer>"], [{"answer": "5"}] * 3
        )
        assert scores == [1.0, 0.0, 1.0]
        assert fn.verifier.timeouts == 1
    finally:
        fn.close()


def test_missing_answer_column_is_an_error(accuracy):
    with pytest.raises(ValueError, match="'answer' column"):
        accuracy(["q"], ["<answer>1</answer>"], [{"prompt": "q"}])


@pytest.mark.parametrize(
    ("text", "fmt", "tags"),
    [
        ("<think>2+3=5</think><answer>5</answer>", 1.0, 1.0),
        ("  <think>\nok\n</think>\n\n<answer>\n5\n</answer>\n", 1.0, 1.0),
        ("<think>a</think> then <answer>5</answer>", 0.0, 1.0),  # prose between the blocks
        ("Sure! <think>a</think><answer>5</answer>", 0.0, 1.0),  # prose before
        ("<think>a</think><answer>5</answer> done", 0.0, 1.0),  # prose after
        ("<answer>5</answer><think>a</think>", 0.0, 1.0),  # wrong order
        ("<think>a</think><think>b</think><answer>5</answer>", 1.0, 0.5),  # repeated think
        ("<think>a</think>", 0.0, 0.5),
        ("<think>a<answer>5</answer>", 0.0, 0.75),
        ("<answer>5</answer>", 0.0, 0.5),
        ("5", 0.0, 0.0),
        ("", 0.0, 0.0),
    ],
)
def test_format_and_tag_count(text, fmt, tags):
    assert format_score(text) == fmt
    assert tag_count_score(text) == tags


def test_math_rewards_weighted_one_one_eight():
    comps = [
        "<think>2+3=5</think><answer>5</answer>",  # 1 + 1 + 8
        "<think>2+3=6</think><answer>6</answer>",  # 1 + 1 + 0
        "the answer is 5",  # 0 + 0 + 8
        "<answer>5</answer>",  # 0.5 + 0 + 8
    ]
    with combine(MATH_REWARDS) as reward:
        totals, parts = reward.score(["q"] * 4, comps, [{"answer": "5"}] * 4)
        assert totals == [10.0, 2.0, 8.0, 8.5]
        assert parts == {
            "tag_count": [1.0, 1.0, 0.0, 0.5],
            "format": [1.0, 1.0, 0.0, 0.0],
            "math_accuracy": [1.0, 0.0, 1.0, 1.0],
        }
        assert reward(["q"], [comps[0]], [{"answer": "5"}]) == [10.0]


def test_combine_weights_and_negative_weights():
    reward = combine([{"name": "format", "weight": 2.0}, {"name": "tag_count", "weight": -4.0}])
    totals, parts = reward.score(["q"], ["<answer>5</answer>"], [{}])
    assert parts == {"format": [0.0], "tag_count": [0.5]}
    assert totals == [2.0 * 0.0 - 4.0 * 0.5]


def test_combine_rejects_bad_specs():
    with pytest.raises(ValueError, match="registered rewards: format, math_accuracy, reward_model"):
        combine([{"name": "python_exec"}])
    with pytest.raises(ValueError, match="bad options"):
        combine([{"name": "format", "options": {"strict": True}}])
    with pytest.raises(ValueError, match="repeated: format"):
        combine([{"name": "format"}, {"name": "format", "weight": 2}])
    with pytest.raises(ValueError, match="at least one"):
        combine([])
    with pytest.raises(ValueError):
        RewardSpec.model_validate({"name": "format", "code": "import os"})  # extra fields
    with pytest.raises(ValueError, match="must align"):
        combine([{"name": "format"}]).score(["q"], ["a", "b"], [{}, {}])


def test_registry_is_closed_and_torch_free():
    assert set(REWARDS) == {"math_accuracy", "format", "tag_count", "reward_model", "string_check"}
    code = (
        "import sys, trainer.rewards; "
        "assert 'torch' not in sys.modules and 'math_verify' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- reward model: a real LlamaForSequenceClassification with random weights (conftest) ---


RM_PROMPTS = [
    "What is 2+2?",
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a river."}],
    "Hi",
]
RM_COMPLETIONS = ["4", "The Nile, which flows north through eleven countries.", "Hello there!"]


def test_reward_model_scores_batches_deterministically(reward_model_dir):
    reward = combine(
        [{"name": "reward_model", "options": {"path": str(reward_model_dir), "batch_size": 2}}]
    )
    first, parts = reward.score(RM_PROMPTS, RM_COMPLETIONS, [{}] * 3)
    second, _ = reward.score(RM_PROMPTS, RM_COMPLETIONS, [{}] * 3)
    assert len(first) == 3 and first == second == parts["reward_model"]
    assert len(set(first)) == 3  # random weights still tell the three apart
    one_by_one = [
        reward.score([p], [c], [{}])[0][0] for p, c in zip(RM_PROMPTS, RM_COMPLETIONS, strict=True)
    ]
    assert one_by_one == pytest.approx(first, abs=1e-5)  # padding does not change a score
    # The score depends on the completion, not only on the prompt.
    swapped, _ = reward.score(RM_PROMPTS[:1], ["5"], [{}])
    assert swapped[0] != pytest.approx(first[0])


def test_reward_model_weight_scales_scores(reward_model_dir):
    opts = {"path": str(reward_model_dir)}
    base, _ = combine([{"name": "reward_model", "options": opts}]).score(
        RM_PROMPTS, RM_COMPLETIONS, [{}] * 3
    )
    scaled, _ = combine([{"name": "reward_model", "weight": -0.5, "options": opts}]).score(
        RM_PROMPTS, RM_COMPLETIONS, [{}] * 3
    )
    assert scaled == pytest.approx([-0.5 * b for b in base])


def test_reward_model_needs_a_local_single_output_model(reward_model_dir, tmp_path):
    with pytest.raises(ValueError, match="not a local model directory"):
        combine([{"name": "reward_model", "options": {"path": "RLHFlow/ArmoRM-Llama3-8B"}}])
    from transformers import AutoConfig, LlamaForSequenceClassification

    config = AutoConfig.from_pretrained(reward_model_dir)
    config.num_labels = 3
    LlamaForSequenceClassification(config).save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((reward_model_dir / name).read_bytes())
    with pytest.raises(ValueError, match="num_labels=1"):
        combine([{"name": "reward_model", "options": {"path": str(tmp_path)}}])


def test_contract_names_exactly_the_registered_sources():
    """The spec (torch-free, in contract/) validates reward names against REWARD_NAMES; the
    worker builds them from the registry. A source added to one and not the other would be
    accepted by the API and then fail in the worker (or never be offered)."""
    from contract.rewards import REWARD_NAMES
    from trainer.rewards.registry import REWARDS

    assert set(REWARDS) == REWARD_NAMES


def test_string_check_reward_matches_openais_operations():
    completions = [" yes\n", "no", "I say yes", "I SAY YES"]
    records = [{"answer": "yes"}] * 4
    score = {
        op: StringCheck(op)(["p"] * 4, completions, records) for op in ("eq", "ne", "like", "ilike")
    }
    assert score == {
        "eq": [1.0, 0.0, 0.0, 0.0],
        "ne": [0.0, 1.0, 1.0, 1.0],
        "like": [1.0, 0.0, 1.0, 0.0],
        "ilike": [1.0, 0.0, 1.0, 1.0],
    }


def test_string_check_renders_openais_templates_with_each_records_fields():
    """The grader's templates read each sample's own record: `{{item.<field>}}` renders the
    line's field, `{{sample.output_text}}` the completion."""
    grader = StringCheck(
        "eq", input="Answer: {{sample.output_text}}", reference="Answer: {{item.city}}"
    )
    records = [{"city": "Paris"}, {"city": "Lyon"}, {"city": "Paris"}]
    assert grader(["p"] * 3, ["Paris", "Paris", " Paris\n"], records) == [1.0, 0.0, 1.0]
    nested = StringCheck("ilike", reference="{{item.meta.code}}")  # input: the completion
    assert nested(["p"] * 2, ["code XY-1", "no"], [{"meta": {"code": "xy-1"}}] * 2) == [1.0, 0.0]
    with pytest.raises(ValueError, match=r"\{\{item.city\}\}, which a training line lacks"):
        grader(["p"], ["Paris"], [{"answer": "Paris"}])
    with pytest.raises(ValueError, match="must read the completion"):
        StringCheck("eq", input="{{item.a}}", reference="{{item.b}}")
