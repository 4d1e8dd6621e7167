"""Random-weight models of real shapes and small data files for benchmarks/gpu_smoke.py.

No weights travel to a bare GPU machine: each model is a random Llama of a named shape with
the tiny-llama BPE tokenizer (vocab 512, trained locally); the model keeps the real vocabulary
size, so its embedding and LM head cost what they cost.
"""

from __future__ import annotations

import json
from pathlib import Path

SMOLLM2_SHAPE = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
}
ONE_B_SHAPE = {
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}
TINY_SHAPE = {
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}  # head_dim 64: vLLM's CPU kernels need it
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "bright",
    "stars",
    "watch",
    "quietly",
]


def build_model(out: Path, shape: dict, seed: int = 0, pad_tokenizer: bool = False) -> Path:
    """A random Llama of `shape` with the tiny-llama tokenizer, saved as an HF directory (bf16).
    `pad_tokenizer`: add placeholder tokens up to the model's vocabulary, for engines (vLLM)
    whose detokenizer fails on a sampled id the tokenizer does not have."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from trainer.modeling import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model("tiny-llama"))
    if pad_tokenizer:
        tok.add_tokens([f"<|x{i}|>" for i in range(len(tok), shape["vocab_size"])])
    config = LlamaConfig(
        **shape,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # instant init on a GPU
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig.from_model_config(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
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
