"""benchmarks/testbed.py's one base everywhere (issue 35) and the environment fingerprint.

The base policy is a product SFT job; its float kernels are chosen per CPU (AVX-512 on one
machine, AVX2 on another), and the same recipe built a 35.5% base on one machine and a 19.0%
base on another. The testbed therefore runs every process it starts (the random init, the SFT
job, the arms, the evaluations) with ATen's kernels pinned to AVX2, MKL's code path pinned to
AVX2 (conditional numerical reproducibility) and oneDNN capped at AVX2; the base is built on one
thread, the arms on two (ARM_ENV). The base's weights are pinned by sha256: `check_base`
refuses a base whose `model.safetensors` differs unless the caller says `--unpinned`.

`fingerprint()` is what every study's results carry: base sha256, torch version, CPU model,
the ISA ATen dispatches to (`torch.backends.cpu.get_cpu_capability()`) and the CPU's own,
threads, the pinned environment and the code version.
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path
from typing import Any

# Set before torch is imported in the testbed's process (api.embedded writes it to
# os.environ) and inherited by every job and evaluation process the service starts.
PIN_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2,STRICT",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
# The arms (GRPO jobs, run one at a time by the embedded worker) keep the kernel pins but use
# two threads, the study's 2-core machine: a fixed count (so a run reproduces on any machine
# with ≥ 2 cores), without halving the compute the 45-minute time box was sized on.
ARM_ENV = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}

# sha256 of the full Setup's base (`python benchmarks/testbed.py build`) model.safetensors,
# built under PIN_ENV: 22.0% held-out; two builds on an AMD EPYC (AVX-512 CPU, kernels pinned
# to AVX2) gave these bytes (docs/replication.md, "One base everywhere").
BASE_SHA256 = "a139a98156c4e4adabb2da9765048867956bd7e36c7ec0bacd9e67944bd2a69c"
WEIGHTS = "model.safetensors"


class BaseMismatch(RuntimeError):
    """The base's weights are not the pinned ones."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def base_sha256(base: Path) -> str:
    return sha256(Path(base) / WEIGHTS)


def check_base(base: Path, *, unpinned: bool = False, pinned: str = BASE_SHA256) -> str:
    """The base's sha256; BaseMismatch when it is not `pinned`, unless `unpinned`."""
    got = base_sha256(base)
    if got != pinned and not unpinned:
        raise BaseMismatch(
            f"base {base} has weights sha256 {got}, not the pinned {pinned}: a different "
            "recipe, code or kernel set built it. Rerun with --unpinned to study it anyway "
            "(its results then say so in the fingerprint)."
        )
    return got


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_isa() -> str:
    """The widest vector ISA the CPU itself offers (what ATen would pick unpinned)."""
    try:
        flags = next(
            (ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines()
             if ln.startswith("flags")), [],
        )  # fmt: skip
    except OSError:
        return "unknown"
    for isa, flag in (("AVX512", "avx512f"), ("AVX2", "avx2")):
        if flag in flags:
            return isa
    return "DEFAULT" if flags else "unknown"


def fingerprint(base: Path | None, *, unpinned: bool = False) -> dict[str, Any]:
    """The environment a study ran in. Imports torch: call it after the service is up."""
    import torch

    from reports.version import code_version

    digest = base_sha256(base) if base is not None and (Path(base) / WEIGHTS).exists() else None
    return {
        "base_sha256": digest,
        "base_pinned": digest == BASE_SHA256,
        "unpinned_allowed": unpinned,
        "torch": torch.__version__,
        "cpu_model": _cpu_model(),
        "cpu_isa": _cpu_isa(),
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),  # this process's: the random init's
        "cores": os.cpu_count(),
        "pinned_env": {k: os.environ.get(k) for k in PIN_ENV},  # what processes start with now
        "base_build_env": PIN_ENV,
        "arm_env": {**PIN_ENV, **ARM_ENV},
        "python": platform.python_version(),
        "code_version": code_version(),
    }
