"""`python -m trainer.evaluation run --config eval.json --out DIR` (see trainer.evaluation.run)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.evaluation")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="Run one evaluation config into an output directory.")
    run.add_argument("--config", type=Path, required=True)
    run.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from trainer.evaluation.run import main

    return main(args.config, args.out)


if __name__ == "__main__":
    sys.exit(cli())
