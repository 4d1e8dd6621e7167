"""Random-weight models of real shapes and small data files for benchmarks/gpu_smoke.py.

No weights travel to a bare GPU machine: each model is a random Llama of a named shape with
the tiny-llama BPE tokenizer (vocab 512, trained locally); the model keeps the real vocabulary
size, so its embedding and LM head cost what they cost.
"""

from __future__ import annotations

import json
from pathlib import Path

from contract.memory import BUILTIN_SHAPES, ModelShape

# LlamaConfig keyword arguments (contract.memory.ModelShape, the sizes the memory estimate uses)
SMOLLM2_SHAPE = BUILTIN_SHAPES["smollm2-135m-instruct"].llama_config()
ONE_B_SHAPE = ModelShape(128256, 2048, 8192, 16, 32, 8, 64, True).llama_config()
# Llama-3.1-8B (8.03 B, untied): issue 25's LoRA run
EIGHT_B_SHAPE = ModelShape(128256, 4096, 14336, 32, 32, 8, 128, False).llama_config()
TINY_SHAPE = ModelShape(1024, 128, 256, 2, 2, 1, 64, True).llama_config()  # vLLM's CPU: head_dim 64
WORDS = "the quick brown fox jumps over a lazy dog while seven bright stars watch quietly".split()


def build_model(out: Path, shape: dict, seed: int = 0, pad_tokenizer: bool = False) -> Path:
    """A random Llama of `shape` with the tiny-llama tokenizer, saved as an HF directory (bf16).
    `pad_tokenizer`: add placeholder tokens up to the model's vocabulary, for engines (vLLM)
    whose detokenizer fails on a sampled id the tokenizer does not have."""
    import torch

    from trainer.modeling import load_tokenizer, resolve_model
    from trainer.modeling.sources import save_random_llama

    tok = load_tokenizer(resolve_model("tiny-llama"))
    if pad_tokenizer:
        tok.add_tokens([f"<|x{i}|>" for i in range(len(tok), shape["vocab_size"])])
    on_gpu = torch.cuda.is_available()  # a GPU initialises the weights in an instant
    save_random_llama(
        out, shape, tok, seed=seed, max_position_embeddings=8192, dtype=torch.bfloat16,
        device="cuda" if on_gpu else "cpu",
    )  # fmt: skip
    return out


def _text(tok, n_tokens: int, seed: int) -> str:
    words: list[str] = []
    while len(tok(" ".join(words), add_special_tokens=False)["input_ids"]) < n_tokens:
        words.append(WORDS[(len(words) * 7 + seed) % len(WORDS)])
    return " ".join(words)


def pairs_file(
    model_dir: Path, path: Path, n: int, prompt_tokens: int, completion_tokens: int
) -> Path:
    from trainer.modeling import load_tokenizer

    tok = load_tokenizer(model_dir)
    prompt, answer = _text(tok, prompt_tokens, 1), _text(tok, completion_tokens - 2, 2)
    rows = [
        {
            "prompt": [{"role": "user", "content": f"{i} {prompt}"}],
            "chosen": [{"role": "assistant", "content": f"yes {answer}"}],
            "rejected": [{"role": "assistant", "content": f"no {answer}"}],
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def prompts_file(path: Path) -> Path:
    rows = [
        {"prompt": f"What is {a} + {b}? Answer in <answer></answer> tags.", "answer": str(a + b)}
        for a in range(2, 10)
        for b in range(3, 7)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def reward_model(out: Path, model_dir: Path) -> Path:
    """A random sequence classifier: continuous scores, so every round keeps its prompts."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForSequenceClassification(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out
