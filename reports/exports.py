"""An evaluation's result document in the field's own formats (DESIGN.md §4, issue 35), so a
team can put our numbers beside AlpacaEval's leaderboard and lighteval's MATH-500.

    provenance(doc)                   judge, baseline, decoding parameters, truncated answers
    alpaca_eval_outputs(doc, name)    AlpacaEval's model_outputs.json: [{instruction, output,
                                      generator}]
    alpaca_eval_row(doc, name)        a leaderboard row (AlpacaEval's column names and units:
                                      rates and standard errors in percent, counts as ints)
    leaderboard_csv(row, name)        the row as AlpacaEval's leaderboard.csv writes it
    lighteval_results(doc, name)      lighteval's results file: results["suite|task|0"] =
                                      {extractive_match, extractive_match_stderr}
    export(doc, format, name)         one JSON document per format (the API's /export)

AlpacaEval's `preference` is 1 (baseline preferred) to 2 (model preferred); an item here is
judged in both orders and scores their mean in [0, 1] (a tie ½), so preference = 1 + score:
n_wins counts items above ½, n_wins_base below, n_draws at ½. The baseline is the eval file's
reference outputs. Math: extractive_match is pass@1 (math-verify through `math_accuracy`),
its stderr the SE over problems. Torch-free.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from typing import Any, Literal

ExportFormat = Literal["alpaca_eval", "lighteval"]
LEADERBOARD_COLUMNS = (
    "win_rate",
    "standard_error",
    "n_wins",
    "n_wins_base",
    "n_draws",
    "n_total",
    "discrete_win_rate",
    "mode",
    "avg_length",
    "length_controlled_winrate",
    "lc_standard_error",
)
DECODING_KEYS = ("temperature", "top_p", "max_new_tokens", "n", "seed", "engine")
MATH_JUDGE = "math-verify (the math_accuracy reward: extracted answer vs gold)"


def _pct(x: Any) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else 100.0 * float(x)


def _value(metric: Any) -> Any:
    return metric.get("value") if isinstance(metric, dict) else metric


def _answers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every generated answer: an instruction item, or each sample of a math problem."""
    items = doc.get("items") or []
    if doc.get("kind") == "math":
        return [s for it in items for s in it.get("samples") or []]
    return list(items)


def provenance(doc: dict[str, Any]) -> dict[str, Any]:
    """What a number needs beside it: the judge, the baseline, how answers were decoded and
    how many stopped at max_new_tokens (finish_reason "length"; None where the engine does
    not say)."""
    head = doc.get("evaluation") or {}
    gen = doc.get("generation") or {}
    answers = _answers(doc)
    reasons = [a.get("finish_reason") for a in answers]
    known = [r for r in reasons if r is not None]
    if doc.get("kind") == "instruction":
        judge: Any = head.get("judge") or doc.get("judge")
        generators = sorted(
            {str(g) for it in doc.get("items") or [] if (g := it.get("reference_generator"))}
        )
        baseline: Any = {
            "type": "reference_outputs",
            "file_id": head.get("file_id"),
            "generators": generators,
        }
    else:
        judge = MATH_JUDGE
        baseline = {"type": "gold_answers", "file_id": head.get("file_id")}
    return {
        "judge": judge,
        "baseline": baseline,
        "decoding": {k: gen.get(k) for k in DECODING_KEYS if k in gen},
        "truncated": {
            "answers": len(answers),
            "truncated": sum(r == "length" for r in known) if known else None,
            "finish_reason_known": len(known),
        },
    }


def default_name(doc: dict[str, Any]) -> str:
    """The generator's name: the job (and step) or the base model."""
    head = doc.get("evaluation") or {}
    if head.get("job_id"):
        step = head.get("step")
        return f"{head['job_id']}" + ("" if step is None else f"@step-{step}")
    return str(head.get("base_model") or (doc.get("model") or {}).get("name") or "model")


def alpaca_eval_outputs(doc: dict[str, Any], name: str) -> list[dict[str, str]]:
    return [
        {"instruction": str(it["instruction"]), "output": str(it["output"]), "generator": name}
        for it in doc.get("items") or []
    ]


def alpaca_eval_row(doc: dict[str, Any]) -> dict[str, Any]:
    """One leaderboard row from the per-item scores (AlpacaEval's get_winrate: the mean and
    SEM of preference − 1, in percent) and the length-controlled fit."""
    items = doc.get("items") or []
    scores = [float(it["score"]) for it in items]
    n = len(scores)
    wins = sum(s > 0.5 for s in scores)
    base = sum(s < 0.5 for s in scores)
    draws = n - wins - base
    lc = (doc.get("metrics") or {}).get("lc_win_rate") or {}
    lengths = [len(str(it["output"])) for it in items]
    return {
        "win_rate": 100.0 * statistics.fmean(scores) if n else None,
        "standard_error": 100.0 * statistics.stdev(scores) / math.sqrt(n) if n > 1 else None,
        "n_wins": wins,
        "n_wins_base": base,
        "n_draws": draws,
        "n_total": n,
        "discrete_win_rate": 100.0 * (wins + draws / 2) / n if n else None,
        "mode": "community",
        "avg_length": int(statistics.fmean(lengths)) if lengths else 0,
        "length_controlled_winrate": _pct(_value(lc)),
        "lc_standard_error": _pct(lc.get("se") if isinstance(lc, dict) else None),
    }


def leaderboard_csv(row: dict[str, Any], name: str) -> str:
    """AlpacaEval's leaderboard.csv: an unnamed index column (the generator), then the row."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["", *LEADERBOARD_COLUMNS])
    writer.writerow([name, *("" if row[c] is None else row[c] for c in LEADERBOARD_COLUMNS)])
    return out.getvalue()


def lighteval_results(
    doc: dict[str, Any], name: str, task: str = "math_500", suite: str = "humanline"
) -> dict[str, Any]:
    """lighteval's results file for a math evaluation. The key is suite|task|few-shots (0):
    `task` names the eval file's benchmark (math_500 for MATH-500); the suite says that this
    service, not lighteval's own task code, generated and checked the answers."""
    m = doc.get("metrics") or {}
    p1 = m.get("pass_at_1") or {}
    key = f"{suite}|{task}|0"
    scores = {
        "extractive_match": _value(p1),
        "extractive_match_stderr": p1.get("se") if isinstance(p1, dict) else None,
    }
    n = int(m.get("n_items") or len(doc.get("items") or []))
    gen = doc.get("generation") or {}
    return {
        "config_general": {
            "model_name": name,
            "generation_parameters": {
                "temperature": gen.get("temperature"),
                "top_p": gen.get("top_p"),
                "max_new_tokens": gen.get("max_new_tokens"),
                "seed": gen.get("seed"),
            },
            "num_samples": m.get("n_samples") or gen.get("n"),
            "start_time": doc.get("started_at"),
            "end_time": doc.get("finished_at"),
            "total_evaluation_time_secondes": str(doc.get("wall_clock_s")),
            "code_version": doc.get("code_version"),
        },
        "results": {key: scores, "all": dict(scores)},
        "versions": {key: 0},
        "config_tasks": {
            key: {
                "name": task,
                "suite": [suite],
                "num_fewshots": 0,
                "metrics": ["extractive_match"],
                "evaluation_file": (doc.get("data") or {}).get("sha256"),
            }
        },
        # lighteval's own truncated/padded counts are of prompts, which it owns; ours are
        # answers that hit max_new_tokens, in "provenance"
        "summary_tasks": {key: {"effective_few_shots": 0.0, "n_items": n}},
        "summary_general": {"n_items": n},
    }


def export(
    doc: dict[str, Any], fmt: ExportFormat, name: str | None = None, task: str = "math_500"
) -> dict[str, Any]:
    """The evaluation in `fmt`, with its provenance. ValueError when the kind does not fit
    the format (AlpacaEval is for instruction evaluations, lighteval's MATH for math)."""
    kind = doc.get("kind")
    name = name or default_name(doc)
    if fmt == "alpaca_eval":
        if kind != "instruction":
            raise ValueError(f"format alpaca_eval needs an instruction evaluation, not {kind}")
        row = alpaca_eval_row(doc)
        return {
            "format": "alpaca_eval",
            "generator": name,
            "model_outputs": alpaca_eval_outputs(doc, name),
            "leaderboard": {name: row},
            "provenance": provenance(doc),
        }
    if fmt == "lighteval":
        if kind != "math":
            raise ValueError(f"format lighteval needs a math evaluation, not {kind}")
        return {
            "format": "lighteval",
            **lighteval_results(doc, name, task),
            "provenance": provenance(doc),
        }
    raise ValueError(f"unknown export format {fmt!r}")
