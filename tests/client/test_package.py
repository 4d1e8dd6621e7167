"""`pip install ./client` works on its own: the SDK imports nothing of the service (nor
torch, FastAPI, SQLAlchemy, or the CLI's typer; rich may come in through httpx's own CLI
when it is installed), ships py.typed and the `humanline` console script, and its
source stays Python 3.9-compatible (pyproject: requires-python >= 3.9)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys

from .conftest import ROOT

CLIENT = ROOT / "client"


def test_pip_install_standalone(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(  # a copy: building must not litter the repo with build/ and egg-info
        CLIENT, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(site), str(src)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    assert (site / "humanline_client" / "py.typed").exists()
    assert (
        "humanline = humanline_client.cli:main"
        in next(site.glob("humanline_client-*.dist-info")).joinpath("entry_points.txt").read_text()
    )
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import humanline_client as h; "
        "assert h.__file__.startswith(sys.argv[1]), h.__file__; "
        "c = h.Client(api_key='hl_x'); c.close(); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('api', 'models', 'trainer', 'worker', 'storage', 'torch', 'fastapi', 'sqlalchemy', "
        "'typer', 'tqdm')); "
        "assert not bad, bad; print(h.__version__)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", probe, str(site)],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "0.1.0"
    script = subprocess.run(
        [str(site / "bin" / "humanline"), "--version"],
        env={**env, "PYTHONPATH": str(site)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert script.returncode == 0 and script.stdout.startswith("humanline 0.1.0"), script


def test_source_is_python39_compatible():
    """Syntax of 3.9, and no `X | Y` in annotations (pydantic and typer evaluate them at
    runtime, and 3.9 has no PEP 604 unions; PEP 585 `list[int]` is fine)."""
    for path in sorted((CLIENT / "humanline_client").rglob("*.py")):
        tree = ast.parse(path.read_text(), feature_version=(3, 9))
        for node in ast.walk(tree):
            annotations = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                annotations = [a.annotation for a in args if a.annotation] + [node.returns]
            elif isinstance(node, ast.AnnAssign):
                annotations = [node.annotation]
            for annotation in filter(None, annotations):
                for sub in ast.walk(annotation):
                    assert not (isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.BitOr)), (
                        f"{path.name}:{node.lineno}: {ast.unparse(annotation)}"
                    )
