"""benchmarks/testbed.py's figures: mean ± SE per arm, the pre-registered validity criterion
(online − stale ≥ 3 SE of the difference), the paired analysis (issue 35: within a seed every
arm draws the same prompt stream, so seeds pair the arms): the contrast C_i = hl_i − (on_i +
st_i)/2 with its t interval (C > 0 ⟺ humanline closes more than half the gap), the share
closed with a Fieller interval (t quantiles) when n < 20 and a paired percentile bootstrap
otherwise, paired hl − st and on − hl; cost, mechanism (clipped-gradient share, KL's share of
the loss, clamp fraction) and the picture. Student-t quantiles are computed here (stdlib: the
lock has no scipy)."""

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


# ---- Student t (no scipy in the lock) --------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta (Lentz; Numerical Recipes 6.4)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                    -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):  # fmt: skip
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (bisection on t_cdf)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# ---- the paired analysis -----------------------------------------------------------------
def paired(results: dict[str, list[dict]], *arms: str) -> list[list[float]]:
    """Final accuracies of `arms`, one row per seed that every arm has (sorted by seed)."""
    by = [{r.get("seed", i): r["accuracy"] for i, r in enumerate(results[a])} for a in arms]
    seeds = sorted(set.intersection(*(set(b) for b in by)))
    return [[b[s] for b in by] for s in seeds]


def t_interval(values: list[float], level: float = 0.95) -> dict[str, Any]:
    """Mean, SE and the `level` t interval (df n − 1) of paired differences."""
    n = len(values)
    out: dict[str, Any] = {"mean": mean(values), "se": None, "ci95": None, "n": n, "df": n - 1}
    if n > 1:
        se = statistics.stdev(values) / math.sqrt(n)
        half = t_quantile(0.5 + level / 2.0, n - 1) * se
        out |= {"se": se, "ci95": (out["mean"] - half, out["mean"] + half)}
    return out


def contrast_verdict(ci: tuple[float, float] | None) -> str:
    """The pre-registered rule on C's 95% t interval."""
    if ci is None:
        return "inconclusive"
    if ci[0] > 0:
        return "closes at least half"
    if ci[1] < 0:
        return "closes less than half"
    return "inconclusive"


def fieller(num: list[float], den: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """Fieller's interval for mean(num)/mean(den), paired rows (covariance used), t quantile
    with n − 1 df. None when the denominator is not significantly non-zero at `level` (the
    confidence set is then unbounded)."""
    n = len(num)
    if n < 2 or len(den) != n:
        return None
    a, b = mean(num), mean(den)
    v11, v22 = statistics.variance(num) / n, statistics.variance(den) / n
    v12 = statistics.covariance(num, den) / n
    t2 = t_quantile(0.5 + level / 2.0, n - 1) ** 2
    qa, qb, qc = b * b - t2 * v22, a * b - t2 * v12, a * a - t2 * v11
    disc = qb * qb - qa * qc
    if qa <= 0 or disc < 0:
        return None
    root = math.sqrt(disc)
    return (qb - root) / qa, (qb + root) / qa


def paired_bootstrap_share(
    rows: list[list[float]], n: int = BOOTSTRAP, seed: int = 0
) -> tuple[float, float] | None:
    """95% percentile CI of the share closed, resampling seeds (rows of on, st, hl) jointly."""
    rng = random.Random(seed)
    draws = []
    for _ in range(n):
        pick = [rng.choice(rows) for _ in rows]
        value = share_closed(*([r[i] for r in pick] for i in range(3)))
        if value is not None:
            draws.append(value)
    if len(draws) < n // 2:
        return None
    draws.sort()
    return draws[int(0.025 * len(draws))], draws[int(0.975 * len(draws)) - 1]


def paired_analysis(results: dict[str, list[dict]], s: int) -> dict[str, Any]:
    """The confirmatory study's analysis at stale S (issue 35), over seeds every arm has."""
    rows = paired(results, "online", f"stale-{s}", f"stale-{s}+humanline")
    on, st, hl = ([r[i] for r in rows] for i in range(3))
    contrast = t_interval([h - (o + t) / 2 for o, t, h in rows])
    method = "fieller" if len(rows) < 20 else "paired bootstrap"
    num, den = (
        [h - t for t, h in zip(st, hl, strict=True)],
        [o - t for o, t in zip(on, st, strict=True)],
    )
    ci = fieller(num, den) if len(rows) < 20 else paired_bootstrap_share(rows)
    return {
        "n_pairs": len(rows),
        "contrast": {**contrast, "definition": "hl − (online + stale)/2",
                     "verdict": contrast_verdict(contrast["ci95"])},
        "share_closed": {"value": share_closed(on, st, hl), "ci95": ci, "method": method},
        "hl_minus_stale": t_interval(num),
        "online_minus_hl": t_interval([o - h for o, h in zip(on, hl, strict=True)]),
        "online_minus_stale": t_interval(den),
    }  # fmt: skip


def mechanism(metrics: list[dict[str, float]], spec: dict[str, Any]) -> dict[str, float | None]:
    """Per job, from its step metrics where they carry the figures: the share of steps whose
    gradient norm (before clipping) exceeded optim.max_grad_norm, the KL term's share of the
    loss (β·KL over |β·KL| + |loss − β·KL|, averaged over steps), the mean clamp fraction."""
    max_norm = (spec.get("optim") or {}).get("max_grad_norm", 1.0)
    beta = (spec.get("objective") or {}).get("beta_kl", 0.01)
    norms = [m["grad_norm"] for m in metrics if m.get("grad_norm") is not None]
    shares = []
    for m in metrics:
        if m.get("kl") is not None and m.get("loss") is not None:
            kl_term = abs(beta * m["kl"])
            rest = abs(m["loss"] - beta * m["kl"])
            shares.append(kl_term / (kl_term + rest) if kl_term + rest > 0 else 0.0)
    clamp = [m["clamp_frac"] for m in metrics if m.get("clamp_frac") is not None]
    return {
        "grad_clipped_share": mean([float(v > max_norm) for v in norms]) if norms else None,
        "kl_loss_share": mean(shares) if shares else None,
        "clamp_frac": mean(clamp) if clamp else None,
    }


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
            **{key: mean(vals) if (vals := [r[key] for r in runs if r.get(key) is not None])
               else None for key in ("grad_clipped_share", "kl_loss_share", "clamp_frac")},
        }  # fmt: skip
    out: dict[str, Any] = {"setup": setup, "base_accuracy": base, "arms": arms, "by_stale": {}}
    for s in setup["stales"]:
        if not {"online", f"stale-{s}", f"stale-{s}+humanline"} <= set(results):
            continue  # --arms left this S's comparison out
        on, st, hl = ([r["accuracy"] for r in results[a]]
                      for a in ("online", f"stale-{s}", f"stale-{s}+humanline"))  # fmt: skip
        gap = mean(on) - mean(st)
        se_on, se_st = mean_se(on)["se"], mean_se(st)["se"]
        se_gap = math.hypot(se_on, se_st) if se_on is not None and se_st is not None else None
        valid = se_gap is not None and gap >= 3 * se_gap and gap > 0
        pa = paired_analysis(results, s)
        c = pa["contrast"]
        verdict = "testbed invalid (no gap ≥ 3 SE): no humanline conclusion"
        if valid:
            verdict = f"humanline {c['verdict']}" if c["verdict"] != "inconclusive" else (
                "inconclusive")  # fmt: skip
        out["by_stale"][s] = {
            "gap_online_minus_stale": {"value": gap, "se": se_gap,
                                       "criterion": ">= 3 SE (testbed valid)", "met": valid},
            "contrast": {**c, "criterion": "95% t interval above 0 (closes at least half)",
                         "met": bool(valid and c["ci95"] and c["ci95"][0] > 0)},
            "share_closed": {**pa["share_closed"], "k": k},
            "paired": {key: pa[key] for key in ("n_pairs", "hl_minus_stale", "online_minus_hl",
                                                "online_minus_stale")},
            "verdict": verdict,
        }  # fmt: skip
    s = max(setup["stales"])
    if setup.get("k_sweep") and s in out["by_stale"]:  # the share closed at the largest S per k
        sweep = {k: f"stale-{s}+humanline"}
        sweep |= {kk: f"stale-{s}+humanline-k{kk}" for kk in setup["k_sweep"]}
        out["by_stale"][s]["k_sweep"] = {}
        for kk, arm in sorted(sweep.items()):
            if arm in results:
                pa = paired_analysis({**results, f"stale-{s}+humanline": results[arm]}, s)
                out["by_stale"][s]["k_sweep"][kk] = {
                    "share_closed": pa["share_closed"]["value"],
                    "ci95": pa["share_closed"]["ci95"], "method": pa["share_closed"]["method"],
                    "contrast_ci95": pa["contrast"]["ci95"],
                }  # fmt: skip
    n = min(len(v) for v in results.values())
    out["seeds"] = {"value": n, "criterion": ">= 5", "met": n >= 5}
    return out


def _pct(m: float | None, se: float | None = None) -> str:
    if m is None:
        return "–"
    return f"{100 * m:.1f}" + (f" ± {100 * se:.1f}" if se is not None else "") + "%"


def _ci(ci: Any) -> str:
    return "–" if ci is None else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def _pts(d: dict[str, Any]) -> str:
    ci = d.get("ci95")
    return f"{100 * d['mean']:+.1f} pts" + (
        "" if ci is None else f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"
    )


def _share(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def markdown(summary: dict[str, Any]) -> str:
    """The results as docs/replication.md shows them: per arm, then per S the criterion."""
    lines = [
        "| arm | final accuracy (mean ± SE) | " + " | ".join(
            f"step {s}" for s in sorted(next(iter(summary["arms"].values()))["curve"])
        ) + " | completions sampled | sampling s | training s | clamp frac (mean / max) | "
        "KL (mean / max) | steps grad-clipped | KL share of loss |",
    ]  # fmt: skip
    lines.append("|---" * (lines[0].count("|") - 1) + "|")
    for arm, d in summary["arms"].items():
        curve = " | ".join(_pct(c["mean"], c["se"]) for _, c in sorted(d["curve"].items()))
        lines.append(
            f"| {arm} | {_pct(d['accuracy']['mean'], d['accuracy']['se'])} | {curve} | "
            f"{d['samples_drawn']:.0f} | {d['sampling_s']:.1f} | {d['training_s']:.1f} | "
            f"{d['clamp_frac_mean']:.4f} / {d['clamp_frac_max']:.4f} | "
            f"{d['kl_mean']:.5f} / {d['kl_max']:.5f} | {_share(d.get('grad_clipped_share'))} | "
            f"{_share(d.get('kl_loss_share'))} |"
        )
    lines += ["", "| S | online − stale (± SE of the difference) | valid (≥ 3 SE) | "
              "C = hl − (on + st)/2, 95% t interval | share closed (k = 12) | its 95% CI | "
              "hl − st (paired, 95% t) | on − hl (paired, 95% t) | verdict |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for s, b in summary["by_stale"].items():
        gap, share, c, pr = (
            b["gap_online_minus_stale"],
            b["share_closed"],
            b["contrast"],
            b["paired"],
        )
        value = share["value"]
        shown = "–" if value is None else f"{value:.2f}"
        lines.append(
            f"| {s} | {100 * gap['value']:+.1f} ± {100 * (gap['se'] or 0):.1f} pts | "
            f"{'yes' if gap['met'] else 'no'} | {_pts(c)} | {shown} | "
            f"{_ci(share['ci95'])} ({share['method']}) | {_pts(pr['hl_minus_stale'])} | "
            f"{_pts(pr['online_minus_hl'])} | {b['verdict']} |"
        )
    for s, b in summary["by_stale"].items():
        for k, v in (b.get("k_sweep") or {}).items():
            ci = v["ci95"]
            lines.append(
                f"\nS = {s}, k = {k}: share closed "
                + ("–" if v["share_closed"] is None else f"{v['share_closed']:.2f}")
                + ("" if ci is None else f", 95% CI [{ci[0]:.2f}, {ci[1]:.2f}]")
            )
    if fp := summary.get("fingerprint"):
        lines.append(
            f"\nSeeds analysed: {summary['seeds']['value']} per arm; left out at the deadline: "
            f"{summary.get('seeds_left_out') or 'none'}. Fingerprint: base sha256 "
            f"`{fp['base_sha256']}` ({'pinned' if fp['base_pinned'] else 'NOT the pinned base'}), "
            f"torch {fp['torch']}, {fp['cpu_model']} ({fp['cpu_isa']}, kernels "
            f"{fp['aten_capability']}), {fp['threads']} thread(s) building, arms "
            f"{fp['arm_env'].get('OMP_NUM_THREADS')}, {fp['code_version']}."
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
