"""The code version stamped into manifests: `git describe` of the checkout when there is one
(a dev install, a worker image built with .git), else the installed package's version."""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # the checkout: reports/ lives at its root


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    if (REPO / ".git").exists():
        try:
            out = subprocess.run(
                ["git", "-C", str(REPO), "describe", "--always", "--dirty", "--tags"],
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            ).stdout.strip()
            if out:
                return f"git:{out}"
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        return f"humanline {metadata.version('humanline')}"
    except metadata.PackageNotFoundError:
        return "unknown"
