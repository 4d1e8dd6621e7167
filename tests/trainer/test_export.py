"""The exported model loads on another machine and says what it is; progress events."""

from __future__ import annotations

import json
import shutil

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from trainer.modeling import resolve_model
from trainer.modeling.card import PUBLIC_NAMES, file_sha256, public_base_name
from trainer.modeling.sources import BUILTIN_BY_PUBLIC_NAME, SMOLLM2
from trainer.train import train


def test_public_names():
    assert (
        public_base_name(SMOLLM2) == "HuggingFaceTB/SmolLM2-135M-Instruct" == PUBLIC_NAMES[SMOLLM2]
    )
    assert public_base_name("/models/my-llama") == "/models/my-llama"  # what the user named


def test_a_lora_export_loads_elsewhere_with_a_real_model_card(tmp_path, make_spec, pref_file):
    spec = make_spec(variant="offline+humanline", max_steps=3, adapter={"kind": "lora", "r": 4})
    run = tmp_path / "run"
    result = train(spec, run, progress=False)
    assert result.status == "succeeded"
    # "download" it: a fresh directory, and a local copy of the base model
    fresh, base_copy = tmp_path / "elsewhere" / "model", tmp_path / "elsewhere" / "base"
    shutil.copytree(run / "final", fresh)
    shutil.copytree(resolve_model("tiny-llama"), base_copy)

    config = json.loads((fresh / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "tiny-llama"  # not the worker's cache path
    card = (fresh / "README.md").read_text()
    assert card.startswith("---\nbase_model: tiny-llama\nlibrary_name: peft\n")
    assert "# offline+humanline DPO fine-tune of tiny-llama" in card
    assert f"sha256 `{file_sha256(pref_file)}`" in card
    assert "| loss |" in card and '"sync_every": 1' in card
    assert str(tmp_path) not in card and str(pref_file) not in card  # no server paths

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_copy), fresh)
    exported = load_file(fresh / "adapter_model.safetensors")
    loaded = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    (name, tensor), *_ = [(k, v) for k, v in exported.items() if "lora_B" in k]
    match = [v for k, v in loaded.items() if k.replace(".default", "") == name]
    assert match and torch.equal(match[0], tensor) and tensor.abs().sum() > 0  # trained, loaded


def test_a_full_export_names_its_base_in_the_card(tmp_path, make_spec):
    result = train(make_spec(max_steps=2), tmp_path, progress=False)
    assert result.status == "succeeded"
    card = (tmp_path / "final" / "README.md").read_text()
    assert card.startswith("---\nbase_model: tiny-llama\nlibrary_name: transformers\n")
    AutoModelForCausalLM.from_pretrained(tmp_path / "final")  # loads as it is


def test_progress_events_say_what_the_run_is_doing(tmp_path, make_spec):
    train(make_spec(max_steps=3), tmp_path, progress=False)
    events = [json.loads(ln) for ln in (tmp_path / "events.jsonl").read_text().splitlines()]
    progress = [e["data"] for e in events if e["kind"] == "progress"]
    phases = [p["phase"] for p in progress]
    assert phases[:2] == ["loading_model", "scoring_data"]
    steps = [p for p in progress if p["phase"] == "training"]
    # throttled (one per 10 s), but the first and the last step always report
    assert steps[0]["step"] == 1 and steps[-1]["step"] == 3
    assert all(p["total_steps"] == 3 and p["loss"] is not None for p in steps)
    assert steps[-1]["eta_s"] in (None, 0.0) and steps[0]["eta_s"] >= 0


def test_a_public_base_name_resolves_to_the_builtin():
    # an exported adapter names SmolLM2 by its hub id; evaluation resolves that name offline
    assert BUILTIN_BY_PUBLIC_NAME["HuggingFaceTB/SmolLM2-135M-Instruct"] == SMOLLM2
    assert resolve_model("tiny-llama") == resolve_model(public_base_name("tiny-llama"))
