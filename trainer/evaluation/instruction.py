"""Instruction following, AlpacaEval-style: generate, judge against the reference in both
orders, report win rate ± SE, length-controlled win rate and lengths, with per-item records.

`records` are eval_instruction records ({"instruction", "output", "generator"?}); `generate`
is anything with Generator.generate's signature (tests pass scripted ones); `judge` any
`PairwiseJudge`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from reports.stats import length_controlled_win_rate, mean_se, win_rate
from trainer.evaluation.judges import Pair, PairwiseJudge

GenerateFn = Callable[..., list[list[Any]]]
ORDERS = ("model_first", "reference_first")


def _text(sample: Any) -> str:
    return sample if isinstance(sample, str) else sample.text


def evaluate_instructions(
    records: Sequence[dict[str, Any]],
    generate: GenerateFn,
    judge: PairwiseJudge,
    *,
    generation: dict[str, Any] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Run the whole evaluation; returns the result document (JSON-serialisable)."""
    gen = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 512, "seed": 0, **(generation or {})}
    gen["n"] = 1  # one answer per instruction, as AlpacaEval
    report = progress or (lambda phase, done, total: None)
    t0 = time.perf_counter()
    report("generate", 0, len(records))
    samples = generate([r["instruction"] for r in records], **gen)
    answers = [s[0] for s in samples]
    t_gen = time.perf_counter() - t0
    report("generate", len(records), len(records))

    pairs: list[Pair] = []
    for r, a in zip(records, answers, strict=False):
        pairs.append(Pair(r["instruction"], _text(a), r["output"]))  # model is A
        pairs.append(Pair(r["instruction"], r["output"], _text(a)))  # model is B
    t1 = time.perf_counter()
    report("judge", 0, len(pairs))
    verdicts = judge.judge(pairs)
    t_judge = time.perf_counter() - t1
    report("judge", len(pairs), len(pairs))

    scores = np.array(
        [[verdicts[2 * i].score("A"), verdicts[2 * i + 1].score("B")] for i in range(len(records))],
        dtype=float,
    ).reshape(len(records), 2)
    len_model = np.array([len(_text(a)) for a in answers], dtype=float)
    len_ref = np.array([len(r["output"]) for r in records], dtype=float)
    fit = length_controlled_win_rate(scores, len_model, len_ref)
    flat = [v.verdict for v in verdicts]
    tokens = [getattr(a, "num_tokens", None) for a in answers]

    items = []
    for i, (r, a) in enumerate(zip(records, answers, strict=False)):
        items.append(
            {
                "index": i,
                "instruction": r["instruction"],
                "output": _text(a),
                "reference": r["output"],
                "reference_generator": r.get("generator"),
                "length": int(len_model[i]),
                "reference_length": int(len_ref[i]),
                "num_tokens": tokens[i],
                "finish_reason": getattr(a, "finish_reason", None),
                "judgements": [
                    {
                        "order": order,
                        "verdict": verdicts[2 * i + k].verdict,
                        "raw": verdicts[2 * i + k].raw[:2000],
                        "score": float(scores[i, k]),
                    }
                    for k, order in enumerate(ORDERS)
                ],
                "score": float(scores[i].mean()),
            }
        )
    metrics = {
        "win_rate": win_rate(scores).as_dict(),
        "lc_win_rate": fit.estimate.as_dict(),
        "avg_length": float(len_model.mean()) if len(records) else float("nan"),
        "avg_reference_length": float(len_ref.mean()) if len(records) else float("nan"),
        "avg_tokens": mean_se([t for t in tokens if t is not None]).value,
        "n_items": len(records),
        "n_judgements": len(verdicts),
        "ties": sum(v == "tie" for v in flat),
        "unparsed": sum(v is None for v in flat),
        # How often the judge picked whichever answer came first (0.5 = no position bias).
        "first_position_rate": mean_se(
            [1.0 if v == "A" else 0.0 if v == "B" else 0.5 for v in flat]
        ).value,
        "order_agreement": float(np.mean(scores[:, 0] == scores[:, 1])) if len(records) else 0.0,
    }
    return {
        "kind": "instruction",
        "metrics": metrics,
        "lc_fit": fit.as_dict(),
        "judge": {
            "name": judge.name,
            **({"stats": judge.stats} if hasattr(judge, "stats") else {}),
        },
        "generation": gen,
        "timing": {"generate_s": t_gen, "judge_s": t_judge},
        "items": items,
    }
