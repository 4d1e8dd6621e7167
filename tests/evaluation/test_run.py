"""The evaluation runner (config → result directory) and model loading from every source:
a base model, an exported peft adapter dir, a training checkpoint."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from contract.spec import JobSpec
from trainer.evaluation.generation import Generator, load_model
from trainer.evaluation.run import EXIT_INVALID, EXIT_JUDGE, EXIT_OK, main, run_config
from trainer.modeling import (
    load_policy,
    resolve_model,
    save_pretrained_weights,
    trainable_state_dict,
)
from trainer.modeling.policy import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
MATH_SET = REPO / "examples" / "data" / "math_eval_small.jsonl"
INSTRUCTION_SET = REPO / "examples" / "data" / "instruction_eval_small.jsonl"
TINY_GEN = {"n": 2, "temperature": 0.7, "max_new_tokens": 6, "seed": 0}


@pytest.fixture(scope="module")
def trained_dirs(tmp_path_factory) -> dict[str, Path]:
    """A LoRA policy with non-zero adapter weights, saved both ways the service stores it:
    the exported `final/` (peft) and a training checkpoint `step-N/` (weights + spec)."""
    root = tmp_path_factory.mktemp("trained")
    spec = JobSpec(
        base_model="tiny-llama",
        training_file="unused.jsonl",
        objective="dpo",
        adapter={"kind": "lora", "r": 4},
    )
    model_dir = resolve_model("tiny-llama")
    torch.manual_seed(0)
    model = load_policy(spec, model_dir)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # a visible change: B = 0 would be a no-op adapter
    save_pretrained_weights(model, load_tokenizer(model_dir), root / "final")
    ckpt = root / "step-3"
    ckpt.mkdir()
    save_file(
        {k: v.contiguous() for k, v in trainable_state_dict(model).items()},
        ckpt / "weights.safetensors",
    )
    (ckpt / "spec.json").write_text(spec.model_dump_json())
    return {"final": root / "final", "checkpoint": ckpt}


def _logits(source: dict) -> torch.Tensor:
    model, tokenizer, _ = load_model(source, device="cpu")
    ids = tokenizer("What is 2 + 2?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_every_model_source_loads_the_same_trained_weights(trained_dirs):
    base = _logits({"type": "base", "name": "tiny-llama"})
    final = _logits({"type": "dir", "path": str(trained_dirs["final"]), "base_model": "tiny-llama"})
    ckpt = _logits({"type": "checkpoint", "path": str(trained_dirs["checkpoint"])})
    assert torch.allclose(final, ckpt, atol=1e-4)  # exported adapter == checkpoint weights
    assert not torch.allclose(final, base, atol=1e-3)  # and the adapter is really applied
    with pytest.raises(ValueError, match="unknown model source"):
        load_model({"type": "hub", "name": "x"})


def test_generator_samples_n_per_prompt_reproducibly():
    gen = Generator.from_source({"type": "base", "name": "tiny-llama"}, device="cpu")
    a = gen.generate(["Hi", "What is 3 + 4?"], **TINY_GEN)
    b = gen.generate(["Hi", "What is 3 + 4?"], **TINY_GEN)
    assert [len(r) for r in a] == [2, 2]
    assert [[s.text for s in r] for r in a] == [[s.text for s in r] for r in b]
    assert all(
        0 < s.num_tokens <= 6 and s.finish_reason in ("stop", "length") for r in a for s in r
    )
    greedy = gen.generate(["Hi"], n=3, temperature=0.0, max_new_tokens=5)
    assert len({s.text for s in greedy[0]}) == 1


def test_vllm_evaluations_run_eager_on_cpu(monkeypatch):
    """An evaluation samples once: on vLLM's CPU backend compiling the model would cost minutes
    at every start (its compile cache does not load back), so the engine runs eager there."""
    import trainer.sampling

    calls: list[dict] = []
    monkeypatch.setattr(trainer.sampling, "make_sampler", lambda *a, **kw: calls.append(kw))
    for gpu in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda gpu=gpu: gpu)
        Generator(torch.nn.Linear(1, 1), None, Path("m"), engine="vllm")
    assert [c.get("enforce_eager") for c in calls] == [True, None]


def test_math_run_writes_result_report_and_progress(tmp_path, trained_dirs):
    config = {
        "kind": "math",
        "data": str(MATH_SET),
        "max_items": 4,
        "generation": TINY_GEN,
        "model": {"type": "checkpoint", "path": str(trained_dirs["checkpoint"])},
        "evaluation": {"id": "eval-t"},
    }
    doc = run_config(config, tmp_path)
    assert doc["metrics"]["n_items"] == 4 and doc["metrics"]["n_samples"] == 2
    assert 0.0 <= doc["metrics"]["pass_at_1"]["value"] <= 1.0
    assert doc["data"]["records"] == 4 and len(doc["data"]["sha256"]) == 64
    assert doc["model"] == {"type": "checkpoint"}  # local paths are not reported
    assert doc["generation"]["engine"] == "hf" and doc["generation"]["device"] == "cpu"
    assert doc["evaluation"] == {"id": "eval-t"} and doc["code_version"]
    assert json.loads((tmp_path / "result.json").read_text())["metrics"] == doc["metrics"]
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert json.loads((tmp_path / "progress.json").read_text())["phase"] == "done"


def test_instruction_run_with_the_local_openai_judge(tmp_path, local_openai_server, monkeypatch):
    s = local_openai_server
    config = {
        "kind": "instruction",
        "data": str(INSTRUCTION_SET),
        "max_items": 3,
        "generation": {"max_new_tokens": 8},
        "model": {"type": "base", "name": "tiny-llama"},
        "judge": {"type": "openai", "base_url": s.base_url, "model": s.model, "max_tokens": 4},
    }
    monkeypatch.setenv("HUMANLINE_JUDGE_API_KEY", s.api_key)
    assert main_with_config(config, tmp_path) == EXIT_OK
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    m = doc["metrics"]
    assert m["n_items"] == 3 and m["n_judgements"] == 6
    assert 0.0 <= m["win_rate"]["value"] <= 1.0 and 0.0 <= m["lc_win_rate"]["value"] <= 1.0
    assert doc["judge"]["stats"]["requests"] == 6 + 1  # six verdicts + the preflight
    assert all(len(it["judgements"]) == 2 for it in doc["items"])


def main_with_config(config: dict, tmp_path: Path) -> int:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return main(path, tmp_path / "out")


def test_an_unreachable_judge_fails_fast_before_generating(tmp_path):
    config = {
        "kind": "instruction",
        "data": str(INSTRUCTION_SET),
        "model": {"type": "base", "name": "smollm2-135m-instruct"},  # never loaded
        "judge": {
            "type": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "model": "m",
            "max_attempts": 2,
            "timeout": 1,
            "deadline": 3,
        },
    }
    t0 = time.monotonic()
    assert main_with_config(config, tmp_path) == EXIT_JUDGE
    error = json.loads((tmp_path / "out" / "error.json").read_text())
    assert error["type"] == "judge_error" and "connection error" in error["message"]
    assert time.monotonic() - t0 < 10


def test_invalid_data_or_config_exit_2(tmp_path):
    config = {
        "kind": "math",
        "data": str(INSTRUCTION_SET),
        "model": {"type": "base", "name": "tiny-llama"},
    }
    assert main_with_config(config, tmp_path) == EXIT_INVALID  # an instruction file for math
    assert (
        "eval_instruction" in json.loads((tmp_path / "out" / "error.json").read_text())["message"]
    )
    assert main_with_config({"kind": "poetry"}, tmp_path) == EXIT_INVALID
    assert (
        main_with_config(
            {
                "kind": "instruction",
                "data": str(INSTRUCTION_SET),
                "model": {"type": "base", "name": "tiny-llama"},
            },
            tmp_path,
        )
        == EXIT_INVALID
    )
