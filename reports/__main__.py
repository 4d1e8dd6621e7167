"""python -m reports RUN_DIR [--out report.html] [--json report.json]

A job report from a trainer run directory (what `python -m trainer run` writes)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from reports import load_run_dir, render_job_html


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, help="HTML output (default RUN_DIR/report.html)")
    parser.add_argument("--json", type=Path, help="also write the JSON report here")
    args = parser.parse_args(argv)
    report = load_run_dir(args.run_dir)
    out = args.out or args.run_dir / "report.html"
    out.write_text(render_job_html(report), encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    print(out)


if __name__ == "__main__":
    main()
