"""Every benchmark script starts: `--help` imports all it imports and parses its options.

A benchmark is run by hand, rarely; a module it imports from (apiserver, openloop, api_load)
can change under it without any test noticing (slow_clients.py imported names that had moved
out of api_load and could not start). `--help` exits before any measurement, so this costs a
few seconds a script.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(
    p for p in (REPO / "benchmarks").glob("*.py") if 'if __name__ == "__main__"' in p.read_text()
)


def _help(script: Path) -> tuple[str, int, str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'client'}"}
    out = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=300,
    )  # fmt: skip
    return script.name, out.returncode, (out.stdout + out.stderr)[-2000:]


def test_every_benchmark_script_starts_and_documents_quick():
    assert len(SCRIPTS) >= 10, SCRIPTS
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(_help, SCRIPTS))
    failed = [(name, rc, text) for name, rc, text in results if rc != 0]
    assert not failed, failed
    # the house rule: every benchmark has a --quick run (< 60 s)
    no_quick = [name for name, _, text in results if "--quick" not in text]
    assert not no_quick, no_quick
