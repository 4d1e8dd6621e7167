"""Make an exported model load elsewhere and say what it is.

`save_pretrained_weights` writes what transformers/peft write: an adapter whose
``base_model_name_or_path`` is the worker's cache directory, and PEFT's placeholder card.
`finish_export` replaces both: the base model is named publicly (a built-in by its Hugging Face
id, a user's directory by the name the job gave it), and README.md becomes a model card with
the spec, the data's hash, the objective/variant/humanline parameters, the final metrics and
the code version. No server path, hostname or pid is written.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from contract.spec import JobSpec
from trainer.modeling.sources import PUBLIC_NAMES


def public_base_name(base_model: str) -> str:
    """A built-in's hub id; anything else exactly as the job named it."""
    return PUBLIC_NAMES.get(base_model, base_model)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _spec_for_card(spec: JobSpec) -> dict[str, Any]:
    body = spec.model_dump(mode="json")
    body.pop("training_file", None)  # a path on the worker: the hash below names the data
    return body


def model_card(
    spec: JobSpec,
    *,
    base: str,
    steps: int,
    metrics: dict[str, float],
    data_sha256: str,
    code_version: str,
    adapter: bool,
) -> str:
    objective = spec.objective.name
    tags = ["humanline", objective, spec.data_source] + (
        ["humanline-variant"] if spec.humanline else []
    )
    shown = {k: round(v, 6) for k, v in sorted(metrics.items()) if isinstance(v, (int, float))}
    hp = spec.humanline_params.model_dump(mode="json") if spec.humanline else None
    load = (
        "from peft import AutoPeftModelForCausalLM\n"
        'model = AutoPeftModelForCausalLM.from_pretrained("<this directory>")'
        if adapter
        else "from transformers import AutoModelForCausalLM\n"
        'model = AutoModelForCausalLM.from_pretrained("<this directory>")'
    )
    lines = [
        "---",
        f"base_model: {base}",
        f"library_name: {'peft' if adapter else 'transformers'}",
        "tags:",
        *[f"- {t}" for t in tags],
        "---",
        "",
        f"# {spec.variant} {objective.upper()} fine-tune of {base}",
        "",
        f"Trained by Humanline ({code_version}) for {steps} steps: objective `{objective}`, "
        f"variant `{spec.variant}`, reference sync `{spec.sync}`.",
        "",
        "## Humanline",
        "",
        f"```json\n{json.dumps(hp, indent=2)}\n```" if hp else "Off (plain variant).",
        "",
        "## Data",
        "",
        f"Training file sha256 `{data_sha256}`.",
        "",
        "## Final metrics",
        "",
        *(
            ["| metric | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in shown.items()]]
            if shown
            else ["(none logged)"]
        ),
        "",
        "## Evaluations",
        "",
        "Evaluations named in the job run after training; their reports are attached to the job.",
        "",
        "## Load",
        "",
        f"The base model is `{base}`: a local copy works too (pass its directory).",
        "",
        f"```python\n{load}\n```",
        "",
        "## Job spec",
        "",
        f"```json\n{json.dumps(_spec_for_card(spec), indent=2)}\n```",
        "",
    ]
    return "\n".join(lines)


def finish_export(
    out_dir: Path, spec: JobSpec, *, steps: int, metrics: dict[str, float], code_version: str
) -> None:
    """Name the base model publicly and write the model card (rank 0, after the export)."""
    base = public_base_name(spec.base_model)
    config = out_dir / "adapter_config.json"
    adapter = config.is_file()
    if adapter:
        body = json.loads(config.read_text())
        body["base_model_name_or_path"] = base
        config.write_text(json.dumps(body, indent=2, sort_keys=True))
    card = model_card(
        spec,
        base=base,
        steps=steps,
        metrics=metrics,
        data_sha256=file_sha256(spec.training_file),
        code_version=code_version,
        adapter=adapter,
    )
    (out_dir / "README.md").write_text(card)
