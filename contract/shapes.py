"""The sizes of a decoder-only transformer that memory depends on (contract.memory), and the
built-in models' shapes, so the API can estimate them without their files. Torch-free."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that memory depends on (fields in this order:
    `BUILTIN_SHAPES` lists them positionally)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> ModelShape:
        """From a model directory's config.json (OSError, ValueError when it has none or it
        does not parse): the one reader the trainer and the API share."""
        return cls.from_config(json.loads((Path(model_dir) / "config.json").read_text()))

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """From a Hugging Face config.json (Llama names, with GPT-2's as fallbacks; a
        multimodal config's `text_config` is used when present). Missing sizes follow the
        usual defaults (MLP 4 × hidden, one KV head per head); ValueError when the config
        names no hidden size, layer count or vocabulary."""
        config = config.get("text_config") or config

        def get(*names: str, default: Any = None) -> Any:
            for name in names:
                value = config.get(name)
                if value is not None:
                    return value
            if default is None:
                raise ValueError(f"config.json has none of {', '.join(names)}")
            return default

        hidden = int(get("hidden_size", "n_embd", "d_model"))
        heads = int(get("num_attention_heads", "n_head", "num_heads"))
        return cls(
            vocab_size=int(get("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(
                get("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
            ),
            num_layers=int(get("num_hidden_layers", "n_layer", "num_layers")),
            num_heads=heads,
            num_kv_heads=int(get("num_key_value_heads", default=heads)),
            head_dim=int(get("head_dim", default=hidden // heads)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        )

    def llama_config(self) -> dict[str, Any]:
        """These sizes under a Hugging Face LlamaConfig's names (the inverse of from_config)."""
        return {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "tie_word_embeddings": self.tie_word_embeddings,
        }

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of a decoder layer, by module name."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, self.q_size),
            "k_proj": (h, self.kv_size),
            "v_proj": (h, self.kv_size),
            "o_proj": (self.q_size, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def params(self) -> int:
        """Parameters: embeddings, the output layer unless tied, layers and norms."""
        h = self.hidden_size
        layer = sum(a * b for a, b in self.projections().values()) + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + head + self.num_layers * layer + h

    def lora_params(self, r: int, target_modules: list[str]) -> int:
        """Adapter parameters: r × (in + out) per targeted projection per layer. A name that
        is not a Llama projection counts as the largest one (conservative)."""
        dims = self.projections()
        largest = max(a + b for a, b in dims.values())
        per_layer = sum(sum(dims[m]) if m in dims else largest for m in target_modules)
        return r * per_layer * self.num_layers


# The built-in models' names: the job spec's base_model, and SmolLM2's public (Hugging Face
# hub) name, which an exported model names as its base and base_model may use as an alias.
SMOLLM2, SMOLLM2_PUBLIC, TINY_LLAMA = (
    "smollm2-135m-instruct",
    "HuggingFaceTB/SmolLM2-135M-Instruct",
    "tiny-llama",
)
# The built-in models' shapes (trainer.modeling.sources builds them; a test checks these
# against the config.json each build writes), so the API needs no model on its disk.
BUILTIN_SHAPES: dict[str, ModelShape] = {
    SMOLLM2: ModelShape(49152, 576, 1536, 30, 9, 3, 64, True),
    TINY_LLAMA: ModelShape(512, 64, 128, 2, 4, 2, 16, True),
}
BUILTIN_SHAPES[SMOLLM2_PUBLIC] = BUILTIN_SHAPES[SMOLLM2]
