"""The page shell and small HTML helpers: one self-contained document, no external URLs, no
scripts (nothing to load, nothing to fail), every value escaped."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

CSS = """
:root { --fg:#1d2433; --muted:#5b6475; --line:#e3e6ec; --bg:#ffffff; --card:#f7f8fa;
        --accent:#3b6fd8; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       background: var(--bg); margin: 0; padding: 24px 32px 64px; max-width: 1280px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 32px 0 10px;
     border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 14px; margin: 16px 0 6px; }
.muted { color: var(--muted); } .small { font-size: 12px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 14px 0; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px;
        padding: 10px 14px; min-width: 150px; }
.card .label { font-size: 12px; color: var(--muted); }
.card .value { font-size: 20px; font-weight: 600; }
.card .se { font-size: 12px; color: var(--muted); }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(360px, 1fr)); gap: 14px; }
.grid > div, figure { margin: 0; background: #fff; border: 1px solid var(--line);
                      border-radius: 8px; padding: 8px; }
svg { max-width: 100%; height: auto; display: block; }
table { border-collapse: collapse; width: 100%; font-size: 13px; margin: 6px 0 12px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line);
         vertical-align: top; }
th { background: var(--card); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: 10px;
      overflow: auto; font-size: 12px; max-height: 480px; white-space: pre-wrap;
      word-break: break-word; }
details > summary { cursor: pointer; color: var(--accent); }
.warn { background: #fff6e5; border: 1px solid #f3c26b; border-radius: 6px; padding: 8px 12px;
        margin: 8px 0; }
.bad { color: #b42318; } .good { color: #067647; }
.tag { display: inline-block; padding: 1px 7px; border-radius: 10px; background: var(--card);
       border: 1px solid var(--line); font-size: 12px; }
"""


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "–"
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
            return f"{value:.3e}"
        return f"{value:.{digits}g}"
    return str(value)


def pct(est: dict[str, Any] | None, digits: int = 1) -> str:
    """'62.5% ± 3.1' from an Estimate dict (fractions)."""
    if not est or est.get("value") is None or not math.isfinite(float(est["value"])):
        return "–"
    out = f"{100 * est['value']:.{digits}f}%"
    se = est.get("se")
    if se is not None and math.isfinite(float(se)):
        out += f" ± {100 * se:.{digits}f}"
    return out


def card(label: str, value: str, note: str = "") -> str:
    extra = f'<div class="se">{esc(note)}</div>' if note else ""
    return (
        f'<div class="card"><div class="label">{esc(label)}</div>'
        f'<div class="value">{esc(value)}</div>{extra}</div>'
    )


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    numeric: Sequence[int] = (),
    raw: Sequence[int] = (),
) -> str:
    """Cells are escaped, except columns listed in `raw` (already HTML)."""
    num = set(numeric)
    head = "".join(
        f'<th class="num">{esc(h)}</th>' if i in num else f"<th>{esc(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = []
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            text = v if i in raw else esc(v)
            cells.append(f'<td class="num">{text}</td>' if i in num else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def pre_json(obj: Any) -> str:
    return f"<pre>{esc(json.dumps(obj, indent=2, sort_keys=True, default=str))}</pre>"


def clip(text: str | None, limit: int) -> str:
    text = text or ""
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more characters]"


def page(title: str, body: str, subtitle: str = "", code_version: str | None = None) -> str:
    """The document. Every page records the code version: `code_version` (what produced the
    job or evaluation) when given, and always the version that rendered the page."""
    from reports.version import code_version as rendered_by

    sub = f'<div class="muted">{subtitle}</div>' if subtitle else ""
    made = f"code version {esc(code_version)} · " if code_version else ""
    footer = (
        f'<footer class="muted small" id="code-version">{made}'
        f"report rendered by {esc(rendered_by())}</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # No network at all: a report is a file that must render the same offline, forever.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">"
        f"<title>{esc(title)}</title><style>{CSS}</style></head>"
        f"<body><h1>{esc(title)}</h1>{sub}{body}<hr>{footer}</body></html>\n"
    )
