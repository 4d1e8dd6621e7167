"""The tree as the README and the package docstrings describe it, and as CI checks it: a
folder or module added without saying where it belongs, a package left out of the lint and
type check, or a module grown past MAX_MODULE_LINES, fails here."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Packages whose docstring is their table of contents: each module and subpackage named.
DESCRIBED = ["api", "api/routes", "contract", "models", "worker", "trainer", "tools"]
MAX_MODULE_LINES = 500  # a longer module mixes concerns: split it (tests and benchmarks too)


def _tracked() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return out.splitlines()


def _tracked_top_level() -> set[str]:
    return {line.split("/")[0] for line in _tracked() if "/" in line}


def test_no_module_is_over_the_line_limit():
    lengths = {
        path: len((ROOT / path).read_text().splitlines())
        for path in _tracked()
        if path.endswith(".py") and (ROOT / path).is_file()
    }
    over = {path: n for path, n in lengths.items() if n > MAX_MODULE_LINES}
    assert len(lengths) > 300 and not over, f"over {MAX_MODULE_LINES} lines: {over}"


def _layout_table() -> str:
    """README's `| folder | holds |` table."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^\| folder \| holds \|\n(?:\|.*\n)+", text, re.M)
    assert match, "README.md has no `| folder | holds |` table"
    return match.group(0)


def test_the_readme_layout_table_names_every_top_level_folder():
    table = _layout_table()
    folders = {d for d in _tracked_top_level() if (ROOT / d).is_dir() and not d.startswith(".")}
    missing = sorted(d for d in folders if f"`{d}/`" not in table)
    assert not missing, f"README.md's layout table does not name: {missing}"
    first_column = " ".join(row.split("|")[1] for row in table.splitlines()[2:])
    named = set(re.findall(r"`([a-z_]+)/`", first_column))
    stale = sorted(d for d in named if not (ROOT / d).is_dir())
    assert not stale, f"README.md's layout table names folders that do not exist: {stale}"


@pytest.mark.parametrize("package", DESCRIBED)
def test_each_package_docstring_names_its_modules(package):
    directory = ROOT / package
    doc = ast.get_docstring(ast.parse((directory / "__init__.py").read_text())) or ""
    parts = [
        p.stem if p.is_file() else p.name
        for p in directory.iterdir()
        if (p.suffix == ".py" and not p.name.startswith("_"))
        or (p.is_dir() and (p / "__init__.py").is_file())
    ]
    missing = sorted(name for name in parts if not re.search(rf"\b{name}\b", doc))
    assert not missing, f"{package}/__init__.py's docstring does not name: {missing}"


def _python_packages() -> set[str]:
    return {
        p.parent.name
        for p in ROOT.glob("*/__init__.py")
        if p.parent.name not in {"tests", "migrations"}
    } | {"client"}


def test_ci_lints_and_type_checks_every_package():
    """`make lint`'s default paths cover every package, and CI runs it unnarrowed."""
    makefile = (ROOT / "Makefile").read_text()
    match = re.search(r"^LINT_PATHS \?= (.+)$", makefile, re.M)
    assert match, "Makefile has no default LINT_PATHS"
    missing = sorted(_python_packages() - set(match.group(1).split()))
    assert not missing, f"make lint does not check: {missing}"
    ci = (ROOT / ".ci/run").read_text().splitlines()
    lint = [line.strip() for line in ci if line.strip().startswith("make lint")]
    assert lint == ["make lint"], f".ci/run must run `make lint` as is, runs {lint}"


def test_the_suite_shows_its_slowest_tests_and_ci_bounds_its_time():
    """`make test` lists its 25 slowest tests; CI runs it (as is) under a 45-minute budget."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^test: .*\n\t(.+)$", makefile, re.M)
    assert recipe and "--durations=25" in recipe.group(1), "make test must print its slowest"
    ci = (ROOT / ".ci/run").read_text()
    assert re.search(r"^TEST_BUDGET_S=\$\{TEST_BUDGET_S:-2700\}$", ci, re.M), "45 min budget"
    assert re.search(r"^timeout .*\"\$TEST_BUDGET_S\" make test\b", ci, re.M)
