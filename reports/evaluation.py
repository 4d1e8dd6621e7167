"""One evaluation's HTML page, from its result document (trainer.evaluation.instruction /
math output, plus the `evaluation` header the worker adds)."""

from __future__ import annotations

import math
from typing import Any

from reports import plots
from reports.exports import provenance
from reports.html import card, clip, esc, fmt, page, pct, pre_json, table

MAX_ITEMS_SHOWN = 200
MAX_TEXT = 1500


def _judge_warnings(m: dict[str, Any]) -> str:
    out = []
    first = m.get("first_position_rate")
    if first is not None and math.isfinite(first) and abs(first - 0.5) > 0.3:
        out.append(
            f"The judge picked the {'first' if first > 0.5 else 'second'} answer in "
            f"{100 * max(first, 1 - first):.0f}% of judgements: it is strongly position-biased. "
            "Judging both orders cancels the bias, but the verdicts carry little information."
        )
    n = m.get("n_judgements") or 0
    if n and (m.get("unparsed") or 0) / n > 0.1:
        out.append(
            f"{m['unparsed']} of {n} judge replies had no verdict (counted as ties); "
            "check the judge model and its max_tokens."
        )
    return "".join(f'<div class="warn">{esc(w)}</div>' for w in out)


def _instruction(doc: dict[str, Any]) -> str:
    m = doc["metrics"]
    cards = [
        card("length-controlled win rate", pct(m.get("lc_win_rate")), "± 1 SE"),
        card("win rate", pct(m.get("win_rate")), "± 1 SE; ties count ½"),
        card(
            "average length",
            f"{fmt(m.get('avg_length'))} chars",
            f"reference {fmt(m.get('avg_reference_length'))}",
        ),
        card("items", fmt(m.get("n_items")), f"{fmt(m.get('n_judgements'))} judgements"),
        card("ties / unparsed", f"{fmt(m.get('ties'))} / {fmt(m.get('unparsed'))}"),
        card(
            "first-position rate",
            f"{100 * (m.get('first_position_rate') or float('nan')):.1f}%",
            "50% = no position bias",
        ),
    ]
    items = doc.get("items") or []
    fit = doc.get("lc_fit") or {}
    coef = fit.get("coef") or {}
    fig = ""
    if items and fit.get("length_scale"):
        scale = fit["length_scale"]
        feat = [math.tanh((it["length"] - it["reference_length"]) / scale) for it in items]
        fig = plots.win_vs_length(
            feat,
            [it["score"] for it in items],
            coef.get("intercept", float("nan")),
            coef.get("length", float("nan")),
        )
    fit_rows = [(k, fmt(v), fmt((fit.get("se") or {}).get(k))) for k, v in coef.items()]
    rows = []
    for it in items[:MAX_ITEMS_SHOWN]:
        verdicts = " / ".join(
            f"{j['order']}: {j['verdict'] or 'unparsed'}" for j in it["judgements"]
        )
        detail = (
            f"<details><summary>{esc(clip(it['instruction'], 120))}</summary>"
            f"<h3>Model ({it['length']} chars)</h3><pre>{esc(clip(it['output'], MAX_TEXT))}</pre>"
            f"<h3>Reference ({it['reference_length']} chars)</h3>"
            f"<pre>{esc(clip(it['reference'], MAX_TEXT))}</pre>"
            f"<h3>Judge replies</h3>"
            f"<pre>{esc(chr(10).join(clip(j['raw'], 300) for j in it['judgements']))}</pre>"
            "</details>"
        )
        rows.append(
            (it["index"], detail, fmt(it["score"]), verdicts, it["length"], it["reference_length"])
        )
    more = (
        f'<p class="muted">First {MAX_ITEMS_SHOWN} of {len(items)} items; all are in the JSON.</p>'
        if len(items) > MAX_ITEMS_SHOWN
        else ""
    )
    return (
        f'<div class="cards">{"".join(cards)}</div>'
        + _judge_warnings(m)
        + "<h2>Length control</h2>"
        '<p class="muted small">Logistic model of each judgement on tanh(Δlength/σ) (Dubois et '
        "al. 2024); the length-controlled win rate is its prediction at equal lengths. A judge "
        "that prefers longer answers shows a steep curve; the raw win rate then overstates a "
        "model that writes long answers.</p>"
        f'<div class="grid">{f"<figure>{fig}</figure>" if fig else ""}'
        f"<div>{table(['term', 'coefficient', 'robust SE'], fit_rows, numeric=[1, 2])}"
        f'<p class="small muted">σ(Δlength) = {fmt(fit.get("length_scale"))} chars; '
        f"converged: {fmt(fit.get('converged'))}</p></div></div>"
        "<h2>Items</h2>"
        + table(
            ["#", "instruction (click for answers)", "score", "verdicts", "length", "ref. length"],
            rows,
            numeric=[0, 2, 4, 5],
            raw=[1],
        )
        + more
    )


def _math(doc: dict[str, Any]) -> str:
    m = doc["metrics"]
    cards = [
        card("pass@1", pct(m.get("pass_at_1")), f"mean over {m.get('n_samples')} samples ± 1 SE"),
        card(f"pass@{m.get('n_samples')}", pct(m.get("pass_at_n"))),
        card("format-reward rate", pct(m.get("format_rate")), "<think>…</think><answer>…</answer>"),
        card("\\boxed{} rate", pct(m.get("boxed_rate"))),
        card("problems", fmt(m.get("n_items"))),
        card("average tokens", fmt(m.get("avg_tokens"))),
    ]
    figs = []
    for key, by in (doc.get("breakdown") or {}).items():
        names = list(by)
        svg = plots.bars(
            names,
            [by[n]["value"] for n in names],
            [by[n]["se"] for n in names],
            title=f"pass@1 by {key} (± 1 SE)",
            ylabel="pass@1 (%)",
            xlabel=key,
        )
        if svg:
            figs.append(f"<div>{svg}</div>")
    items = doc.get("items") or []
    rows = []
    for it in items[:MAX_ITEMS_SHOWN]:
        samples = "".join(
            f"<h3>sample {k}: {'correct' if s['correct'] else 'wrong'} "
            f"(extracted {esc(s.get('extracted'))})</h3>"
            f"<pre>{esc(clip(s['text'], MAX_TEXT))}</pre>"
            for k, s in enumerate(it["samples"][:4])
        )
        detail = f"<details><summary>{esc(clip(it['problem'], 120))}</summary>{samples}</details>"
        rows.append(
            (
                it["index"],
                detail,
                it["answer"],
                f"{100 * it['pass_at_1']:.0f}%",
                it.get("level") or "–",
                it.get("subject") or "–",
            )
        )
    return (
        f'<div class="cards">{"".join(cards)}</div>'
        + (f'<h2>Breakdown</h2><div class="grid">{"".join(figs)}</div>' if figs else "")
        + "<h2>Problems</h2>"
        + table(
            ["#", "problem (click for samples)", "answer", "pass@1", "level", "subject"],
            rows,
            numeric=[0, 3],
            raw=[1],
        )
    )


def render_evaluation_html(doc: dict[str, Any]) -> str:
    head = doc.get("evaluation") or {}
    kind = doc.get("kind")
    body = _instruction(doc) if kind == "instruction" else _math(doc) if kind == "math" else ""
    settings = {
        k: doc.get(k)
        for k in (
            "generation",
            "judge",
            "prompt_template",
            "system_prompt",
            "timing",
            "model",
            "data",
            "code_version",
        )
        if doc.get(k)
    }
    body += "<h2>Judge, baseline, decoding, truncated answers</h2>" + pre_json(provenance(doc))
    body += "<h2>Settings</h2>" + pre_json({"evaluation": head, **settings})
    what = (
        head.get("job_id") or head.get("base_model") or (doc.get("model") or {}).get("name") or ""
    )
    step = head.get("step")
    subtitle = esc(
        f"{kind} · {what}"
        + ("" if not head.get("job_id") else f" · {'final' if step is None else f'step {step}'}")
        + f" · file {head.get('file_id') or (doc.get('data') or {}).get('path', '')}"
    )
    version = doc.get("code_version") or head.get("code_version")
    return page(f"Evaluation {head.get('id', '')}", body, subtitle, code_version=version)
