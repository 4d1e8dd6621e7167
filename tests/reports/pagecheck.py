"""Checks of a rendered page as headless Chromium parsed it (`--dump-dom`): every plot has
drawn data and both axis labels, and the page records the code version.

The plots tag what they draw (matplotlib gids): data artists `data-N`, axis labels `xlabel` and
`ylabel`; the SVG writer prefixes ids per figure. A plot without a `data-` group holding a path
with coordinates is an empty chart."""

from __future__ import annotations

import re
from pathlib import Path

from tests.fixtures.browser import run_chromium

SVG = re.compile(r"<svg\b.*?</svg>", re.DOTALL)
# a tagged group holding, before the next tagged group, a drawn path or a placed marker (<use>)
DATA = re.compile(
    r'<g id="[^"]*-data-[\d-]+"[^>]*>(?:(?!<g id=).)*?'
    r'(?:<path(?![^>]*\bid=)[^>]*\bd="M\s*-?[\d.]+ -?[\d.]+|<use\b[^>]*\bx="-?[\d.]+")',
    re.DOTALL,
)
TEXT = re.compile(r"<text\b[^>]*>\s*([^<]+?)\s*</text>", re.DOTALL)


def dump_dom(html_path: Path) -> str:
    proc = run_chromium(html_path, "--dump-dom")
    assert proc.returncode == 0 and "<body" in proc.stdout, proc.stderr[-2000:]
    return proc.stdout


def _label_text(svg: str, which: str) -> str:
    m = re.search(rf'<g id="[^"]*-{which}"[^>]*>(.*?)</g>', svg, re.DOTALL)
    if not m:
        return ""
    return " ".join(TEXT.findall(m.group(1))).strip()


def plot_problems(dom: str) -> list[str]:
    """One line per plot that is empty or lacks an axis label ([] when all is well)."""
    problems = []
    for i, svg in enumerate(SVG.findall(dom)):
        title = (TEXT.findall(svg) or ["?"])[-1]
        if not DATA.search(svg):
            problems.append(f"plot {i} ({title}): no data drawn")
        for axis in ("xlabel", "ylabel"):
            if not _label_text(svg, axis):
                problems.append(f"plot {i} ({title}): no {axis}")
    return problems


def plot_count(dom: str) -> int:
    return len(SVG.findall(dom))
