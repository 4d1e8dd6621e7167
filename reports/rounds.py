"""Online jobs: one row per sampling round, from the trainer's `round` events (whose data is the
round's stats: round/index, round/prompts, round/examples, round/sample_time, round/score_time,
reward/mean and reward/<source>), or from the metrics of the steps that opened a round.

Kept = examples the round trains on (pairs for DPO, groups for GRPO, two unpaired examples per
pair for KTO); kept prompts = kept / examples per prompt; filtered share = 1 − kept prompts /
sampled prompts. A round stops sampling once it has enough examples and keeps only what its
steps use, so the filtered share is an upper bound. Sampled tokens show where the trainer logs
them (round/sampled_tokens)."""

from __future__ import annotations

from typing import Any

from reports import plots
from reports.html import esc, fmt, table
from reports.stats import finite_number

PER_PROMPT = {"dpo": 1, "kto": 2, "grpo": 1}
KEPT_NAME = {"dpo": "kept pairs", "kto": "kept examples", "grpo": "kept groups"}


def round_rows(
    events: list[dict[str, Any]], metrics: list[dict[str, Any]], objective: str | None
) -> list[dict[str, Any]]:
    raw: dict[int, dict[str, Any]] = {}
    for m in metrics:
        if finite_number(m.get("round/index")) is not None:
            raw.setdefault(int(m["round/index"]), {"step": m.get("step"), **m})
    for e in events:  # events come from every round, whatever log_every is: they win
        data = e.get("data") or {}
        if e.get("kind") == "round" and finite_number(data.get("round/index")) is not None:
            raw[int(data["round/index"])] = {"step": data.get("step"), **data}
    per = PER_PROMPT.get(objective or "", 1)
    rows = []
    for index in sorted(raw):
        d = raw[index]
        prompts, kept = (
            finite_number(d.get("round/prompts")),
            finite_number(d.get("round/examples")),
        )
        filtered = finite_number(d.get("round/filtered_frac"))
        if filtered is None and prompts and kept is not None:
            filtered = max(0.0, 1.0 - (kept / per) / prompts)
        rows.append(
            {
                "round": index,
                "step": d.get("step"),
                "prompts": prompts,
                "kept": kept,
                "filtered_share": filtered,
                "reward": finite_number(d.get("reward/mean")),
                "rewards": {
                    k.removeprefix("reward/"): finite_number(v)
                    for k, v in d.items()
                    if k.startswith("reward/") and k != "reward/mean"
                },
                "sampled_tokens": finite_number(d.get("round/sampled_tokens")),
                "sample_time": finite_number(d.get("round/sample_time")),
                "score_time": finite_number(d.get("round/score_time")),
            }
        )
    return rows


def round_warnings(rows: list[dict[str, Any]]) -> list[str]:
    rewards = [r["reward"] for r in rows if r["reward"] is not None]
    out = []
    if len(rewards) >= 2 and all(r == 0 for r in rewards):
        out.append(
            "Flat at zero: the mean reward of the sampled completions is 0 in every round. "
            "The reward never fires: the task is too hard for the model, or the reward source "
            "does not match the completions' format."
        )
    elif len(rewards) >= 2 and max(rewards) - min(rewards) == 0:
        out.append(
            f"The mean reward is {fmt(rewards[0])} in every round: it does not move with training."
        )
    high = [r for r in rows if r["filtered_share"] is not None and r["filtered_share"] >= 0.9]
    if high:
        out.append(
            f"{len(high)} of {len(rows)} rounds filtered at least 90% of their prompts: most "
            "groups had no reward variance (every completion scored the same)."
        )
    return out


def rounds_section(rows: list[dict[str, Any]], objective: str | None) -> str:
    if not rows:
        return ""
    kept_name = KEPT_NAME.get(objective or "", "kept examples")
    xs = [r["round"] for r in rows]
    figs = []
    reward_series = {"mean": (xs, [r["reward"] for r in rows])}
    sources = sorted({n for r in rows for n in r["rewards"]})
    for name in sources if len(sources) > 1 else []:  # one source: it is the mean
        reward_series[name] = (xs, [r["rewards"].get(name) for r in rows])
    spec = [
        ("Reward of sampled completions", reward_series, "mean reward"),
        (
            "Prompts sampled and examples kept",
            {
                "prompts": (xs, [r["prompts"] for r in rows]),
                kept_name: (xs, [r["kept"] for r in rows]),
            },
            "count",
        ),
        (
            "Filtered share of prompts",
            {"filtered": (xs, [r["filtered_share"] for r in rows])},
            "share",
        ),
        ("Sampled tokens", {"tokens": (xs, [r["sampled_tokens"] for r in rows])}, "tokens"),
    ]
    for title, series, ylabel in spec:
        svg = plots.line_panel(title, series, xlabel="round", ylabel=ylabel)
        if svg:
            figs.append(f"<div>{svg}</div>")
    tokens_logged = any(r["sampled_tokens"] is not None for r in rows)
    table_rows = [
        (
            r["round"],
            fmt(r["step"]),
            fmt(r["prompts"]),
            fmt(r["kept"]),
            "–" if r["filtered_share"] is None else f"{100 * r['filtered_share']:.0f}%",
            fmt(r["reward"]),
            fmt(r["sampled_tokens"]) if tokens_logged else "not logged",
            fmt(r["sample_time"]),
        )
        for r in rows
    ]
    return (
        "<h2>Online rounds</h2>"
        f'<p class="muted small">{esc(__doc__.split(chr(10) + chr(10))[1])}</p>'
        f'<div class="grid">{"".join(figs)}</div>'
        + table(
            [
                "round",
                "first step",
                "prompts",
                kept_name,
                "filtered",
                "reward",
                "sampled tokens",
                "sample s",
            ],
            table_rows,
            numeric=[0, 1, 2, 3, 4, 5, 6, 7],
        )
    )
