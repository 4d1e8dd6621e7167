"""The READMEs' job examples, read from the READMEs themselves: every YAML job spec is a valid
`JobSpec`, and the main run (SmolLM2, DPO) trains the same adapter whichever way it is
submitted: the YAML spec, the CLI's flags, `--spec` with that YAML, the SDK, or the `openai`
package with our `extra_body`.

A copied example must not silently train something else: a CLI line without the adapter would
fine-tune every weight while the YAML beside it trains a LoRA adapter.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from contract.spec import AdapterConfig, JobSpec

from .conftest import ROOT, jsonl

READMES = [ROOT / "README.md", ROOT / "client" / "README.md"]
CLI_DOC = ROOT / "client" / "humanline_client" / "cli" / "__init__.py"
MAIN_MODEL = "smollm2-135m-instruct"


@pytest.fixture
def prefs(client) -> str:
    """Enough pairs for the README's batch of 32."""
    rows = [
        {"prompt": f"What is {i} + {i}?", "chosen": str(2 * i), "rejected": "?"} for i in range(32)
    ]
    return client.files.upload(file=jsonl(rows), filename="prefs.jsonl").id


def _blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", path.read_text(), re.S)


def _yaml_specs() -> list[dict[str, Any]]:
    return [yaml.safe_load(block) for block in _blocks(ROOT / "README.md", "yaml")]


def _main_spec() -> JobSpec:
    """The README's job-spec example: the YAML block that names a base model."""
    (spec,) = [s for s in _yaml_specs() if "base_model" in s]
    assert spec["base_model"] == MAIN_MODEL
    return JobSpec.model_validate(spec)


def _cli_creates(text: str) -> list[list[str]]:
    """Every `humanline jobs create ...` line (backslash continuations joined), as argv after
    `humanline`; `# comments` and `[optional]` flags dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in joined.splitlines():
        line = line.strip().lstrip("$ ")
        if line.startswith("humanline jobs create"):
            line = re.sub(r"\[[^\]]*\]", "", line.split("  #")[0])
            found.append(shlex.split(line)[1:])
    return found


def _cli_examples() -> list[list[str]]:
    texts = [path.read_text() for path in READMES] + [
        ast.get_docstring(ast.parse(CLI_DOC.read_text())) or ""
    ]
    return [argv for text in texts for argv in _cli_creates(text)]


def _create_calls() -> list[tuple[str, ast.Call]]:
    """Every `*.jobs.create(...)` call in the READMEs' Python blocks, with where it is."""
    calls = []
    for path in READMES:
        for block in _blocks(path, "python"):
            for node in ast.walk(ast.parse(block)):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "create"
                    and isinstance(node.func.value, ast.Attribute)
                    and node.func.value.attr == "jobs"
                ):
                    calls.append((path.name, node))
    return calls


def _kwargs(call: ast.Call) -> dict[str, Any]:
    """The call's keyword arguments that are literals (ids and paths in the examples are
    variables: left out)."""
    out = {}
    for kw in call.keywords:
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            continue
    return out


def test_every_readme_yaml_spec_validates():
    specs = _yaml_specs()
    assert len(specs) >= 2  # the job spec and the online example
    for spec in specs:
        # the online example is a fragment of a spec: it names no base model
        JobSpec.model_validate({"base_model": MAIN_MODEL, **spec})
    assert _main_spec().adapter.kind == "lora"


def test_the_readme_examples_are_found():
    """The parsers below read what the READMEs hold (a renamed block must not make the
    agreement tests pass on nothing)."""
    flag_lines = [argv for argv in _cli_examples() if "--objective" in argv]
    assert len(flag_lines) >= 2  # client/README.md's and the CLI's own help
    assert any("--spec" in argv for argv in _cli_examples())
    models = [_kwargs(c).get("base_model") or _kwargs(c).get("model") for _, c in _create_calls()]
    assert models.count(MAIN_MODEL) >= 4  # the SDK in both READMEs, openai in both


def test_sdk_and_openai_examples_train_the_yaml_adapter():
    expected = _main_spec().adapter
    for where, call in _create_calls():
        kwargs = _kwargs(call)
        if (kwargs.get("base_model") or kwargs.get("model")) != MAIN_MODEL:
            continue  # another journey (the async example's tiny-llama KTO)
        adapter = kwargs.get("adapter", kwargs.get("extra_body", {}).get("spec", {}).get("adapter"))
        assert adapter is not None, f"{where}: {ast.unparse(call)[:80]}... names no adapter"
        assert AdapterConfig.model_validate(adapter) == expected, (where, adapter)


@pytest.mark.parametrize("argv", [a for a in _cli_examples() if "--objective" in a], ids=str)
def test_cli_flags_train_the_yaml_adapter(cli, prefs, argv):
    """Run the README's CLI line as written (the file id swapped for a real one; no worker
    runs here, so not `--wait`) and compare the spec the server stored with the YAML's."""
    argv = [prefs if a.startswith("file-") else a for a in argv if a != "--wait"]
    job = json.loads(cli(*argv, "--json").stdout)
    assert job["base_model"] == MAIN_MODEL
    assert AdapterConfig.model_validate(job["spec"]["adapter"]) == _main_spec().adapter


def test_cli_spec_file_trains_the_yaml_adapter(cli, prefs, tmp_path):
    """`humanline jobs create --spec job.yaml --file ...` with the README's YAML, as is."""
    job_yaml = tmp_path / "job.yaml"
    job_yaml.write_text(next(b for b in _blocks(ROOT / "README.md", "yaml") if "base_model" in b))
    job = json.loads(
        cli("jobs", "create", "--spec", str(job_yaml), "--file", prefs, "--json").stdout
    )
    stored = JobSpec.model_validate({**job["spec"], "training_file": "prefs.jsonl"})
    assert stored.adapter == _main_spec().adapter
    # the server adds only the operator's max_runtime (the wall-clock limit it holds jobs to)
    assert stored.max_runtime is not None
    assert stored.resolved().model_copy(update={"max_runtime": None}) == _main_spec().resolved()
