"""Plots as inline SVG strings, drawn with matplotlib's object API (no pyplot, no global
figure state: safe in a threaded API process; the SVG backend needs no display).

Each SVG is cleaned for embedding in one self-contained page: no XML prolog, DOCTYPE or
metadata (they carry external URLs), no namespace declarations (HTML5 parses inline SVG
without them), and every element id prefixed per figure so that several figures on one page
never share a clip-path id.
"""

from __future__ import annotations

import io
import itertools
import math
import re
from collections.abc import Mapping, Sequence

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

matplotlib.rcParams.update(
    {
        "svg.fonttype": "none",  # real <text>: small, selectable, rendered with the page's font
        "svg.hashsalt": "humanline",  # deterministic ids
        "font.family": "sans-serif",
        "font.size": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.3,
    }
)

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"]
VARIANT_COLORS = {  # the paper's Figure 1
    "offline": "#d62728",
    "offline+humanline": "#ff7f0e",
    "online": "#1f77b4",
    "online+humanline": "#6a9955",
}
_counter = itertools.count()
_ID = re.compile(r'\bid="([^"]+)"')


def to_svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.DOTALL)
    svg = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg)
    svg = re.sub(r'\s+version="[^"]*"', "", svg, count=1)
    prefix = f"f{next(_counter)}-"
    for old in set(_ID.findall(svg)):
        svg = svg.replace(f'id="{old}"', f'id="{prefix}{old}"')
        svg = svg.replace(f"#{old})", f"#{prefix}{old})")
        svg = svg.replace(f'href="#{old}"', f'href="#{prefix}{old}"')
    svg = svg.replace("<svg ", '<svg role="img" ', 1)
    return svg


def _finite(xs: Sequence[float | None]) -> list[float]:
    return [float(x) if x is not None and math.isfinite(float(x)) else float("nan") for x in xs]


def has_data(values: Sequence[float | None]) -> bool:
    return any(math.isfinite(v) for v in _finite(values))


def _tag(artists, prefix: str = "data") -> None:
    """Tag each drawn bar with a unique gid (only finite ones: a NaN bar draws nothing)."""
    for j, a in enumerate(artists):
        if math.isfinite(a.get_height()):
            a.set_gid(f"{prefix}-{j}")


def _label(ax, title: str, xlabel: str, ylabel: str) -> None:
    """Title and both axis labels, tagged (gid) so a test can find them in the SVG; data
    artists are tagged `data-N` the same way: a plot without them is an empty chart."""
    ax.set_title(title, fontsize=10, loc="left")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.xaxis.label.set_gid("xlabel")
    ax.yaxis.label.set_gid("ylabel")


def line_panel(
    title: str,
    series: Mapping[str, tuple[Sequence[int], Sequence[float | None]]],
    *,
    ylabel: str,
    xlabel: str = "step",
    logy: bool = False,
    size: tuple[float, float] = (4.2, 2.6),
    colors: dict[str, str] | None = None,
) -> str:
    """Lines of (x, y); series without a finite value are left out, and with none left the
    panel is not drawn at all (returns ""): never an empty chart."""
    series = {k: v for k, v in series.items() if has_data(v[1])}
    if not series:
        return ""
    fig = Figure(figsize=size, dpi=100)
    ax = fig.add_subplot()
    for i, (color, (name, (x, y))) in enumerate(zip(itertools.cycle(PALETTE), series.items())):
        ys = _finite(y)
        ax.plot(
            list(x),
            ys,
            label=name,
            color=(colors or {}).get(name, color),
            linewidth=1.4,
            marker="o" if len(ys) <= 12 else None,
            markersize=3,
            gid=f"data-{i}",
        )
    _label(ax, title, xlabel, ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps and rounds are counts
    if logy:
        ax.set_yscale("log")
    if len(series) > 1:
        ax.legend(fontsize=8, frameon=False)
    return to_svg(fig)


def band_panel(
    title: str,
    series: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float | None]]],
    *,
    ylabel: str,
    xlabel: str,
    percent: bool = False,
    size: tuple[float, float] = (5.0, 3.2),
) -> str:
    """One line per series, (x, mean, SE), with a ± 1 SE band (no band where SE is None); ""
    when no series has a finite mean."""
    series = {k: v for k, v in series.items() if has_data(v[1])}
    if not series:
        return ""
    k = 100.0 if percent else 1.0
    fig = Figure(figsize=size, dpi=100)
    ax = fig.add_subplot()
    for i, (color, (name, (x, mean, se))) in enumerate(
        zip(itertools.cycle(PALETTE), series.items())
    ):
        m = [k * v for v in _finite(mean)]
        e = [k * v for v in _finite([0.0 if v is None else v for v in se])]
        ax.plot(list(x), m, label=name, color=color, linewidth=1.4, marker="o", markersize=3,
                gid=f"data-{i}")  # fmt: skip
        ax.fill_between(list(x), [a - b for a, b in zip(m, e, strict=True)],
                        [a + b for a, b in zip(m, e, strict=True)], color=color, alpha=0.18,
                        linewidth=0, gid=f"band-{i}")  # fmt: skip
    _label(ax, title, xlabel, ylabel + (" (%)" if percent else ""))
    ax.legend(fontsize=7, frameon=False)
    return to_svg(fig)


def scatter(
    points: Sequence[tuple[str, float, float, float | None, str]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    percent: bool = True,
) -> str:
    """Labelled points (label, x, y, y error, color) with ± error bars: quality against cost,
    the paper's Figure 1 idea (better and cheaper is up and to the left)."""
    k = 100.0 if percent else 1.0
    pts = [p for p in points if math.isfinite(p[1]) and math.isfinite(p[2])]
    if not pts:
        return ""
    fig = Figure(figsize=(5.2, 3.2), dpi=100)
    ax = fig.add_subplot()
    for i, (label, x, y, err, color) in enumerate(pts):
        e = err * k if err is not None and math.isfinite(err) else None
        drawn = ax.errorbar(
            [x],
            [y * k],
            yerr=[e] if e is not None else None,
            fmt="o",
            color=color,
            capsize=3,
            markersize=5,
        )
        drawn.lines[0].set_gid(f"data-{i}")
        ax.annotate(label, (x, y * k), textcoords="offset points", xytext=(5, 4), fontsize=7)
    _label(ax, title, xlabel, ylabel)
    return to_svg(fig)


def histogram(
    counts: Sequence[float],
    edges: Sequence[float],
    *,
    title: str,
    xlabel: str,
    marker: float | None = None,
    marker_label: str | None = None,
) -> str:
    fig = Figure(figsize=(5.5, 2.8), dpi=100)
    ax = fig.add_subplot()
    widths = [b - a for a, b in itertools.pairwise(edges)]
    if not has_data(counts) or not any(counts):
        return ""
    ax.bar(
        list(edges[:-1]),
        list(counts),
        width=widths,
        align="edge",
        color="#4c78a8",
        edgecolor="white",
        linewidth=0.5,
    )
    _tag(ax.patches)
    if marker is not None:
        ax.axvline(marker, color="#d62728", linestyle="--", linewidth=1.2, label=marker_label)
        if marker_label:
            ax.legend(fontsize=8, frameon=False)
    _label(ax, title, xlabel, "examples")
    return to_svg(fig)


def bars(
    labels: Sequence[str],
    values: Sequence[float],
    errors: Sequence[float] | None = None,
    *,
    title: str,
    ylabel: str,
    xlabel: str = "checkpoint",
    percent: bool = True,
    reference: float | None = None,
) -> str:
    if not has_data(values):
        return ""
    k = 100.0 if percent else 1.0
    fig = Figure(figsize=(max(3.5, 0.7 * len(labels) + 1.5), 2.8), dpi=100)
    ax = fig.add_subplot()
    xs = range(len(labels))
    vals = [v * k for v in _finite(values)]
    errs = [e * k for e in _finite(errors)] if errors is not None else None
    _tag(ax.bar(xs, vals, yerr=errs, color="#4c78a8", capsize=3))
    ax.set_xticks(
        list(xs),
        list(labels),
        rotation=30 if len(labels) > 4 else 0,
        ha="right" if len(labels) > 4 else "center",
    )
    if reference is not None:
        ax.axhline(reference * k, color="grey", linestyle=":", linewidth=1)
    _label(ax, title, xlabel, ylabel)
    return to_svg(fig)


def grouped_bars(
    groups: Sequence[str],
    series: Sequence[tuple[str, str, Sequence[float], Sequence[float]]],
    *,
    title: str,
    ylabel: str,
    percent: bool = True,
) -> str:
    """The paper's Figure 1: one group per objective, one bar per variant (± 1 SE).
    `series` = [(label, color, values per group, SEs per group)]; NaN leaves a gap."""
    if not any(has_data(values) for _, _, values, _ in series):
        return ""
    k = 100.0 if percent else 1.0
    fig = Figure(figsize=(max(4.5, 1.6 * len(groups) + 2), 3.2), dpi=100)
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(series))
    for s, (label, color, values, errors) in enumerate(series):
        xs = [g + (s - (len(series) - 1) / 2) * width for g in range(len(groups))]
        vals = [v * k for v in _finite(values)]
        errs = [e * k for e in _finite(errors)]
        bar = ax.bar(xs, vals, width=width * 0.95, yerr=errs, color=color, label=label, capsize=3)
        _tag(bar, f"data-{s}")
        for x, v, e in zip(xs, vals, errs, strict=False):
            if math.isfinite(v):
                ax.annotate(
                    f"{v:.1f}" if percent else f"{v:.3g}",
                    (x, v + (e if math.isfinite(e) else 0.0)),  # above the error bar
                    textcoords="offset points",
                    xytext=(0, 3),
                    ha="center",
                    fontsize=7,
                )
    ax.set_xticks(list(range(len(groups))), [g.upper() for g in groups])
    _label(ax, title, "objective", ylabel)
    ax.legend(
        fontsize=8,
        frameon=False,
        ncols=min(4, len(series)),
        loc="upper center",
        bbox_to_anchor=(0.5, -0.28),  # below the x-axis label,
    )
    return to_svg(fig)


def win_vs_length(
    feature: Sequence[float],
    scores: Sequence[float],
    intercept: float,
    slope: float,
    *,
    title: str = "Judge preference vs. length difference",
) -> str:
    """Binned item scores against tanh(Δlen/σ), with the fitted logistic curve: a judge that
    only rewards length shows a steep curve through 50% at Δ = 0."""
    fig = Figure(figsize=(4.6, 2.8), dpi=100)
    ax = fig.add_subplot()
    f = _finite(feature)
    pts = sorted(zip(f, _finite(scores), strict=False))
    nbins = max(1, min(10, len(pts) // 5))
    for b in range(nbins):
        chunk = pts[b * len(pts) // nbins : (b + 1) * len(pts) // nbins]
        if chunk:
            ax.plot(
                sum(p[0] for p in chunk) / len(chunk),
                100 * sum(p[1] for p in chunk) / len(chunk),
                "o",
                color="#4c78a8",
                markersize=4,
                gid=f"data-{b}",
            )
    grid = [-1 + 2 * i / 100 for i in range(101)]
    if math.isfinite(intercept) and math.isfinite(slope):
        curve = [100 / (1 + math.exp(-(intercept + slope * g))) for g in grid]
        ax.plot(grid, curve, color="#d62728", linewidth=1.4, label="fitted GLM")
        ax.legend(fontsize=8, frameon=False)
    ax.axvline(0, color="grey", linewidth=0.8, linestyle=":")
    ax.axhline(50, color="grey", linewidth=0.8, linestyle=":")
    ax.set_ylim(-3, 103)
    _label(ax, title, "tanh(Δ length / σ)   (model longer →)", "model win rate (%)")
    return to_svg(fig)
