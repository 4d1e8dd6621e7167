"""What every sampling engine takes and returns, and how a prompt becomes model input.

Both engines render prompts the same way (the tokenizer's chat template with the generation
prompt, then tokenised *without* extra special tokens, exactly as ``trainer.tokenize`` does for
training), so a completion sampled by either engine is scored and trained on the same context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from trainer.seeds import derive_seed

Messages = list[dict[str, str]]
Prompt = str | Messages


@dataclass(frozen=True)
class SamplingParams:
    """Paper defaults (DESIGN.md §2): G = 8 completions per prompt, T = 0.7, top-p = 0.95.

    ``temperature == 0`` means greedy decoding: one completion is decoded and repeated ``n``
    times (both engines refuse several return sequences without sampling). ``seed`` makes a call
    reproducible; the online loop should pass a different seed each round.
    """

    n: int = 8
    temperature: float = 0.7
    top_p: float = 0.95
    max_new_tokens: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def decoded_per_prompt(self) -> int:
        """How many sequences the engine actually decodes per prompt (1 when greedy)."""
        return 1 if self.greedy else self.n

    def prompt_seed(self, prompt_index: int) -> int:
        """Prompt `prompt_index`'s own reproducible stream (trainer.seeds: never shared)."""
        return derive_seed(self.seed, "prompt", prompt_index)


@dataclass(frozen=True)
class Completion:
    """One sampled completion.

    ``token_ids`` are the generated ids, including the stop token when there is one (the model
    produced it and training should see it); ``text`` is their decoding without special tokens.
    ``finish_reason`` is ``"stop"`` (an end-of-sequence token) or ``"length"``
    (``max_new_tokens`` reached), as vLLM names them.
    """

    prompt_index: int
    text: str
    token_ids: list[int]
    finish_reason: str


class Sampler(Protocol):
    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        """``n`` completions per prompt, in prompt order."""
        ...

    def load_weights(self, model_or_state: Any) -> None:
        """Make later ``generate`` calls sample from these weights (a module or a state dict)."""
        ...


def as_messages(prompt: Prompt) -> Messages:
    """A plain-string prompt is one user turn, as in ``trainer.tokenize``."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def render_prompt_ids(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Chat template + generation prompt, tokenised without adding special tokens again.

    The template already writes its own special tokens; letting the tokenizer (or vLLM, which
    tokenises text prompts with ``add_special_tokens=True``) add a BOS on top would give the
    sampler a context training never sees.
    """
    text = tokenizer.apply_chat_template(
        as_messages(prompt), tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def stop_token_ids(tokenizer: Any, generation_config: Any = None) -> list[int]:
    """The tokenizer's EOS plus any EOS ids the model's generation config declares."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    extra = getattr(generation_config, "eos_token_id", None)
    for tid in extra if isinstance(extra, (list, tuple)) else [extra]:
        if tid is not None and int(tid) not in ids:
            ids.append(int(tid))
    if not ids:
        raise ValueError("the tokenizer has no eos token; sampling could never stop")
    return ids
