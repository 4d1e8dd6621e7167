"""reports.exports (issue 35): AlpacaEval's model_outputs.json and leaderboard row, lighteval's
results file, and the provenance every evaluation carries, checked field by field against the
formats' documented schemas (alpaca-eval and lighteval are not in the lock) and by hand.

AlpacaEval (tatsu-lab/alpaca_eval, README "Making a new evaluator"/"model_outputs", and
metrics.get_winrate): model_outputs is a JSON list of {"instruction", "output", "generator"}
strings; the leaderboard CSV has an unnamed index (the generator) then win_rate,
standard_error, n_wins, n_wins_base, n_draws, n_total, discrete_win_rate, mode, avg_length,
length_controlled_winrate, lc_standard_error, rates and errors in percent, counts and
avg_length integers, mode a string ("community"). lighteval (huggingface/lighteval, "Saving
and reading results"): a JSON object with config_general, results, versions, config_tasks,
summary_tasks, summary_general; results["suite|task|fewshots"] = {metric: float,
metric_stderr: float} and results["all"] the average.
"""

from __future__ import annotations

import csv
import io
import json

import pytest

from reports import exports
from reports.evaluation import render_evaluation_html

# Four items, each judged in both orders: scores 1, ½, 0, ¾ (model preferred, tie,
# reference preferred, model preferred once and tied once).
SCORES = [1.0, 0.5, 0.0, 0.75]
OUTPUTS = ["abcd", "ab", "abcdef", "abcdefgh"]  # 4, 2, 6, 8 chars: mean 5


def _instruction_doc():
    items = [
        {"index": i, "instruction": f"Say {i}.", "output": out, "reference": f"{i}.",
         "reference_generator": "gpt4_turbo", "score": sc, "length": len(out),
         "reference_length": 2, "finish_reason": "length" if i == 2 else "stop",
         "judgements": []}
        for i, (out, sc) in enumerate(zip(OUTPUTS, SCORES, strict=True))
    ]  # fmt: skip
    return {
        "kind": "instruction",
        "metrics": {
            "lc_win_rate": {"value": 0.6, "se": 0.05, "n": 4},
            "win_rate": {"value": 0.5625, "se": 0.2135, "n": 4},
        },  # fmt: skip
        "judge": {"name": "openai:gpt-4.1"},
        "generation": {
            "temperature": 0.7,
            "top_p": 0.9,
            "max_new_tokens": 64,
            "n": 1,
            "seed": 3,
            "engine": "hf",
            "device": "cpu",
        },  # fmt: skip
        "evaluation": {
            "id": "eval-1",
            "kind": "instruction",
            "job_id": "job-9",
            "step": 40,
            "file_id": "file-i",
            "judge": {"type": "openai", "model": "gpt-4.1"},
        },  # fmt: skip
        "items": items,
    }


def _math_doc():
    samples = [[True, False], [True, True], [False, False]]
    return {
        "kind": "math",
        "metrics": {
            "pass_at_1": {"value": 0.5, "se": 0.2887, "n": 3},
            "n_items": 3,
            "n_samples": 2,
        },  # fmt: skip
        "generation": {
            "temperature": 0.6,
            "top_p": 0.95,
            "max_new_tokens": 256,
            "n": 2,
            "seed": 0,
        },  # fmt: skip
        "evaluation": {
            "id": "eval-2",
            "kind": "math",
            "job_id": None,
            "step": None,
            "base_model": "tiny-llama",
            "file_id": "file-m",
        },  # fmt: skip
        "data": {"sha256": "ab" * 32},
        "started_at": "2026-11-29T04:00:00+00:00",
        "finished_at": "2026-11-29T04:01:00+00:00",
        "wall_clock_s": 60.0,
        "items": [
            {
                "index": i,
                "problem": f"{i}+1",
                "answer": str(i + 1),
                "pass_at_1": sum(r) / 2,
                "samples": [
                    {"text": "x", "correct": c, "finish_reason": "length" if not c else "stop"}
                    for c in r
                ],
            }
            for i, r in enumerate(samples)
        ],  # fmt: skip
    }


def test_alpaca_eval_model_outputs_schema():
    out = exports.alpaca_eval_outputs(_instruction_doc(), "job-9@step-40")
    assert len(out) == 4
    for row, text in zip(out, OUTPUTS, strict=True):
        assert set(row) == {"instruction", "output", "generator"}
        assert all(isinstance(v, str) for v in row.values())
        assert row["output"] == text and row["generator"] == "job-9@step-40"
    json.dumps(out)  # a JSON list, as alpaca_eval --model_outputs reads it


def test_alpaca_eval_leaderboard_row_by_hand():
    row = exports.alpaca_eval_row(_instruction_doc())
    assert tuple(row) == exports.LEADERBOARD_COLUMNS
    # wins: 1 and ¾; base: 0; draw: ½. win rate 100 × mean = 56.25; SEM: deviations
    # 0.4375, −0.0625, −0.5625, 0.1875 → Σ² 0.546875, /3 → sd 0.426956, /2 → 21.3478
    assert (row["n_wins"], row["n_wins_base"], row["n_draws"], row["n_total"]) == (2, 1, 1, 4)
    assert row["win_rate"] == pytest.approx(56.25)
    assert row["standard_error"] == pytest.approx(21.3478, abs=1e-4)
    assert row["discrete_win_rate"] == pytest.approx(62.5)  # (2 + ½)/4
    assert row["avg_length"] == 5 and row["mode"] == "community"
    assert row["length_controlled_winrate"] == pytest.approx(60.0)
    assert row["lc_standard_error"] == pytest.approx(5.0)
    types = {"n_wins": int, "n_wins_base": int, "n_draws": int, "n_total": int,
             "avg_length": int, "mode": str}  # fmt: skip
    for col in exports.LEADERBOARD_COLUMNS:
        assert isinstance(row[col], types.get(col, float)), col
    lines = list(csv.reader(io.StringIO(exports.leaderboard_csv(row, "job-9@step-40"))))
    assert lines[0] == ["", *exports.LEADERBOARD_COLUMNS]
    assert lines[1][0] == "job-9@step-40" and lines[1][1] == "56.25" and lines[1][8] == "community"


def test_lighteval_results_shape():
    res = exports.lighteval_results(_math_doc(), "tiny-llama")
    assert set(res) == {"config_general", "results", "versions", "config_tasks",
                        "summary_tasks", "summary_general"}  # fmt: skip
    key = "humanline|math_500|0"
    assert res["results"][key] == {"extractive_match": 0.5, "extractive_match_stderr": 0.2887}
    assert res["results"]["all"] == res["results"][key]
    assert key.split("|")[1:] == ["math_500", "0"] and key in res["versions"]
    assert res["config_general"]["model_name"] == "tiny-llama"
    assert res["config_general"]["generation_parameters"]["temperature"] == 0.6
    json.dumps(res)


def test_provenance_records_judge_baseline_decoding_and_truncation():
    p = exports.provenance(_instruction_doc())
    assert p["judge"] == {"type": "openai", "model": "gpt-4.1"}
    assert p["baseline"] == {"type": "reference_outputs", "file_id": "file-i",
                             "generators": ["gpt4_turbo"]}  # fmt: skip
    assert p["decoding"] == {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 64, "n": 1,
                             "seed": 3, "engine": "hf"}  # fmt: skip
    assert p["truncated"] == {"answers": 4, "truncated": 1, "finish_reason_known": 4}
    m = exports.provenance(_math_doc())  # 6 samples, 3 wrong ones stopped at the limit
    assert m["truncated"] == {"answers": 6, "truncated": 3, "finish_reason_known": 6}
    assert m["judge"] == exports.MATH_JUDGE and m["baseline"]["type"] == "gold_answers"
    page = render_evaluation_html(_math_doc())
    assert "Judge, baseline, decoding" in page and "gold_answers" in page


def test_export_picks_the_format_by_kind():
    out = exports.export(_instruction_doc(), "alpaca_eval")
    assert out["generator"] == "job-9@step-40" and set(out["leaderboard"]) == {"job-9@step-40"}
    assert out["provenance"]["truncated"]["truncated"] == 1
    assert exports.export(_math_doc(), "lighteval", task="math")["results"]["humanline|math|0"]
    with pytest.raises(ValueError, match="instruction"):
        exports.export(_math_doc(), "alpaca_eval")
    with pytest.raises(ValueError, match="math"):
        exports.export(_instruction_doc(), "lighteval")
