"""benchmarks/testbed.py's figures: mean ± SE per arm, the pre-registered validity criterion
(online − stale ≥ 3 SE of the difference), the share of the gap humanline closes with a
percentile bootstrap CI over seeds, cost, mechanism (clamp fraction, KL), and the picture."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path
from typing import Any

BOOTSTRAP = 10_000


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def mean_se(values: list[float]) -> dict[str, float | None]:
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
    return {"mean": mean(values), "se": se}


def share_closed(on: list[float], st: list[float], hl: list[float]) -> float | None:
    gap = mean(on) - mean(st)
    return (mean(hl) - mean(st)) / gap if gap > 0 else None


def bootstrap_share(
    on: list[float], st: list[float], hl: list[float], n: int = BOOTSTRAP, seed: int = 0
) -> tuple[float, float] | None:
    """95% percentile CI of the share closed, resampling seeds within each arm; resamples
    with no gap (online ≤ stale) are dropped (their share is undefined). None if all are."""
    rng = random.Random(seed)
    draws = []
    for _ in range(n):
        value = share_closed(*([rng.choice(v) for _ in v] for v in (on, st, hl)))
        if value is not None:
            draws.append(value)
    if len(draws) < n // 2:
        return None
    draws.sort()
    return draws[int(0.025 * len(draws))], draws[int(0.975 * len(draws)) - 1]


def figures(
    setup: dict[str, Any], results: dict[str, list[dict]], base: float | None, k: int
) -> dict[str, Any]:
    arms: dict[str, Any] = {}
    for arm, runs in results.items():
        steps = sorted({int(s) for r in runs for s in r["curve"]})
        arms[arm] = {
            "accuracy": mean_se([r["accuracy"] for r in runs]),
            "curve": {s: mean_se([r["curve"][s] for r in runs if s in r["curve"]]) for s in steps},
            "samples_curve": {s: mean([r["samples_curve"][s] for r in runs
                                       if s in r.get("samples_curve", {})]) for s in steps},
            "per_seed": runs,
            **{key: mean([r[key] for r in runs])
               for key in ("samples_drawn", "rounds", "sampling_s", "training_s",
                           "wall_clock_s", "clamp_frac_max", "clamp_frac_mean",
                           "kl_max", "kl_mean")},
        }  # fmt: skip
    on = [r["accuracy"] for r in results["online"]]
    out: dict[str, Any] = {"setup": setup, "base_accuracy": base, "arms": arms, "by_stale": {}}
    for s in setup["stales"]:
        st = [r["accuracy"] for r in results[f"stale-{s}"]]
        hl = [r["accuracy"] for r in results[f"stale-{s}+humanline"]]
        gap = mean(on) - mean(st)
        se_on, se_st = mean_se(on)["se"], mean_se(st)["se"]
        se_gap = math.hypot(se_on, se_st) if se_on is not None and se_st is not None else None
        valid = se_gap is not None and gap >= 3 * se_gap and gap > 0
        share = share_closed(on, st, hl)
        ci = bootstrap_share(on, st, hl)
        verdict = "testbed invalid (no gap ≥ 3 SE): no humanline conclusion"
        if valid and ci is not None:
            verdict = (
                "humanline closes the gap"
                if ci[0] >= 0.5
                else "humanline does not close the gap"
                if ci[1] < 0.5
                else "inconclusive"
            )
        out["by_stale"][s] = {
            "gap_online_minus_stale": {"value": gap, "se": se_gap,
                                       "criterion": ">= 3 SE (testbed valid)", "met": valid},
            "share_closed": {"value": share, "ci95": ci, "k": k,
                             "criterion": "CI lower bound >= 0.5",
                             "met": bool(valid and ci is not None and ci[0] >= 0.5)},
            "verdict": verdict,
        }  # fmt: skip
    if setup.get("k_sweep"):  # the share closed at the largest S for each swept k
        s = max(setup["stales"])
        st = [r["accuracy"] for r in results[f"stale-{s}"]]
        sweep = {k: [r["accuracy"] for r in results[f"stale-{s}+humanline"]]}
        sweep |= {kk: [r["accuracy"] for r in results[f"stale-{s}+humanline-k{kk}"]]
                  for kk in setup["k_sweep"]}  # fmt: skip
        out["by_stale"][s]["k_sweep"] = {
            kk: {"share_closed": share_closed(on, st, hl), "ci95": bootstrap_share(on, st, hl)}
            for kk, hl in sorted(sweep.items())
        }
    n = min(len(v) for v in results.values())
    out["seeds"] = {"value": n, "criterion": ">= 5", "met": n >= 5}
    return out


def _pct(m: float | None, se: float | None = None) -> str:
    if m is None:
        return "–"
    return f"{100 * m:.1f}" + (f" ± {100 * se:.1f}" if se is not None else "") + "%"


def markdown(summary: dict[str, Any]) -> str:
    """The results as docs/replication.md shows them: per arm, then per S the criterion."""
    lines = [
        "| arm | final accuracy (mean ± SE) | " + " | ".join(
            f"step {s}" for s in sorted(next(iter(summary["arms"].values()))["curve"])
        ) + " | completions sampled | sampling s | training s | clamp frac (mean / max) | "
        "KL (mean / max) |",
    ]  # fmt: skip
    lines.append("|---" * (lines[0].count("|") - 1) + "|")
    for arm, d in summary["arms"].items():
        curve = " | ".join(_pct(c["mean"], c["se"]) for _, c in sorted(d["curve"].items()))
        lines.append(
            f"| {arm} | {_pct(d['accuracy']['mean'], d['accuracy']['se'])} | {curve} | "
            f"{d['samples_drawn']:.0f} | {d['sampling_s']:.1f} | {d['training_s']:.1f} | "
            f"{d['clamp_frac_mean']:.4f} / {d['clamp_frac_max']:.4f} | "
            f"{d['kl_mean']:.5f} / {d['kl_max']:.5f} |"
        )
    lines += ["", "| S | online − stale (± SE of the difference) | valid (≥ 3 SE) | "
              "share closed by stale+humanline (k = 12) | 95% bootstrap CI | verdict |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for s, b in summary["by_stale"].items():
        gap, share = b["gap_online_minus_stale"], b["share_closed"]
        ci, value = share["ci95"], share["value"]
        shown = "–" if value is None else f"{value:.2f}"
        interval = "–" if ci is None else f"[{ci[0]:.2f}, {ci[1]:.2f}]"
        lines.append(
            f"| {s} | {100 * gap['value']:+.1f} ± {100 * (gap['se'] or 0):.1f} pts | "
            f"{'yes' if gap['met'] else 'no'} | {shown} | {interval} | {b['verdict']} |"
        )
    for s, b in summary["by_stale"].items():
        for k, v in (b.get("k_sweep") or {}).items():
            ci = v["ci95"]
            lines.append(
                f"\nS = {s}, k = {k}: share closed "
                + ("–" if v["share_closed"] is None else f"{v['share_closed']:.2f}")
                + ("" if ci is None else f", 95% CI [{ci[0]:.2f}, {ci[1]:.2f}]")
            )
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for arm, data in summary["arms"].items():
        steps = sorted(int(s) for s in data["curve"])
        m = [data["curve"][s]["mean"] for s in steps]
        se = [data["curve"][s]["se"] or 0.0 for s in steps]
        xs = {"steps": [0, *steps], "samples": [0] + [data["samples_curve"][s] for s in steps]}
        base = summary["base_accuracy"] or 0.0
        ys = [base, *m]
        lo = [base] + [a - b for a, b in zip(m, se, strict=True)]
        hi = [base] + [a + b for a, b in zip(m, se, strict=True)]
        for ax, key in zip(axes, ("steps", "samples"), strict=True):
            (line,) = ax.plot(xs[key], ys, marker="o", label=arm)
            ax.fill_between(xs[key], lo, hi, alpha=0.2, color=line.get_color())
    axes[0].set_xlabel("optimizer step")
    axes[1].set_xlabel("completions sampled")
    axes[0].set_ylabel("held-out accuracy (mean ± SE over seeds)")
    axes[1].legend(fontsize=7)
    fig.suptitle("Testbed: online vs stale vs stale+humanline GRPO (addition, tiny Llama)")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
