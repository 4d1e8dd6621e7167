"""Sampling with transformers ``generate`` on the live policy: the CPU and fallback engine.

It needs no second copy of the weights and no weight transfer (it samples from the very module
being trained), at the cost of throughput: no paged KV cache, no continuous batching, and
finished rows keep padding until the longest row in their chunk stops.

An FSDP2-sharded policy is the exception: its forwards are collective, so each rank samples
from a whole copy gathered at the round's start (trainer.sampling.gathered) and freed by
``sleep`` at the round's end, so training never holds it.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, GenerationConfig

from contract.memory import SAMPLER_ROWS
from trainer.modeling import load_trainable_state_dict
from trainer.sampling.gathered import is_sharded, unsharded_copy
from trainer.sampling.types import (
    Completion,
    Prompt,
    SamplingParams,
    render_prompt_ids,
    stop_token_ids,
)

log = logging.getLogger(__name__)


class HFSampler:
    """Batched ``generate`` with left padding, seeded inside ``fork_rng``.

    ``max_batch_rows`` bounds the rows (prompts × n) decoded together, i.e. the KV-cache memory.
    The caller's global RNG stream is untouched, so sampling in the middle of training does not
    change the training run's own random draws (dropout, humanline sampling, data order).
    """

    def __init__(self, model: nn.Module, tokenizer: Any, max_batch_rows: int = SAMPLER_ROWS):
        # a sharded policy is gathered by load_weights, at the round's start (collective)
        self.model: nn.Module | None = None if is_sharded(model) else model
        self.gathered = False  # whether self.model is our own gathered copy
        self.tokenizer = tokenizer
        self.max_batch_rows = max_batch_rows
        self._stop_ids = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
        self._pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self._stop_ids[0]
        )

    @classmethod
    def from_dir(cls, model_dir: Path, tokenizer: Any, **kw: Any) -> HFSampler:
        """A standalone sampler (evaluation, benchmarks) with its own copy of the model."""
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        return cls(model, tokenizer, **kw)

    def load_weights(self, model_or_state: nn.Module | dict[str, torch.Tensor]) -> None:
        """Sample from this module from now on, or copy a state dict into the current one.

        A state dict goes in through :func:`trainer.modeling.load_trainable_state_dict` (strict
        keys, in place). When this sampler holds the live policy, that *is* loading the policy,
        so the usual call with the live policy is a no-op rebind. An FSDP2-sharded policy is
        gathered into a whole copy instead (a collective: every rank calls this together).
        """
        if isinstance(model_or_state, nn.Module):
            self.model = None  # free the previous copy before gathering the next
            self.gathered = is_sharded(model_or_state)
            self.model = unsharded_copy(model_or_state) if self.gathered else model_or_state
        else:
            load_trainable_state_dict(self._model(), model_or_state)

    def sleep(self) -> None:
        """Between rounds: drop a gathered copy (training gets its memory back; the next
        ``load_weights`` gathers the policy again). The live policy is kept: it is not ours."""
        if self.gathered:
            self.model = None

    def close(self) -> None:
        """Drop a gathered copy; the live policy belongs to the caller."""
        self.sleep()

    def _model(self) -> nn.Module:
        if self.model is None:
            raise RuntimeError("the policy is sharded: load_weights(policy) gathers it first")
        return self.model

    @torch.no_grad()
    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        encoded = [render_prompt_ids(self.tokenizer, p) for p in prompts]
        per_prompt = params.decoded_per_prompt
        chunk = max(1, self.max_batch_rows // per_prompt)
        out: list[list[Completion]] = []
        model = self._model()
        was_training = model.training
        model.eval()
        device = _device_of(model)
        devices = [device.index or 0] if device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(params.seed)  # seeds CPU and every CUDA device
                for start in range(0, len(encoded), chunk):
                    ids = encoded[start : start + chunk]
                    out.extend(self._chunk(ids, start, params, device))
        finally:
            model.train(was_training)
        return out

    def _chunk(
        self, prompts: list[list[int]], first_index: int, params: SamplingParams, device
    ) -> list[list[Completion]]:
        input_ids, attention = _left_pad(prompts, self._pad_id, device)
        rows = self._model().generate(
            input_ids=input_ids,
            attention_mask=attention,
            generation_config=self._config(params),
        )
        new = rows[:, input_ids.shape[1] :].tolist()
        per_prompt = params.decoded_per_prompt
        result = []
        for i in range(len(prompts)):
            row = new[i * per_prompt : (i + 1) * per_prompt]
            decoded = [self._completion(first_index + i, ids) for ids in row]
            if params.greedy:  # one decode, n independent copies
                decoded = [
                    replace(decoded[0], token_ids=list(decoded[0].token_ids))
                    for _ in range(params.n)
                ]
            result.append(decoded)
        return result

    def _config(self, params: SamplingParams) -> GenerationConfig:
        """Every knob set explicitly: transformers fills unset ones from the model's own
        generation config (which may carry a repetition penalty, top-k 50, ...), and the two
        engines must sample from the same distribution. top_k=0 disables top-k as in vLLM."""
        common = {
            "num_beams": 1,
            "repetition_penalty": 1.0,
            "num_return_sequences": params.decoded_per_prompt,
            "max_new_tokens": params.max_new_tokens,
            "eos_token_id": self._stop_ids,
            "pad_token_id": self._pad_id,
            "use_cache": True,  # load_policy turns the cache off for training; decoding needs it
        }
        if params.greedy:
            return GenerationConfig(do_sample=False, **common)
        return GenerationConfig(
            do_sample=True,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=0,
            min_p=None,
            typical_p=1.0,
            **common,
        )

    def _completion(self, prompt_index: int, new_ids: list[int]) -> Completion:
        """Cut at the first stop token (kept); what follows is padding."""
        stop = next((k for k, t in enumerate(new_ids) if t in self._stop_ids), None)
        ids = new_ids if stop is None else new_ids[: stop + 1]
        body = ids if stop is None else ids[:-1]
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        return Completion(prompt_index, text, ids, "length" if stop is None else "stop")


def _left_pad(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoder-only generation appends on the right, so prompts are aligned on the right."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        attn[i, width - len(s) :] = 1
    return ids.to(device), attn.to(device)


def _device_of(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")
