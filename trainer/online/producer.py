"""Rounds sampled by a given policy version, with the sampler's own log-probs: what the async
sampler process runs (trainer.online.sampler_proc), one round after another.

A round is sampled exactly as a synchronous round is (trainer.online.rounds.OnlineData:
the same prompts, seeds, rewards and examples), by the weights of its sampling version
(contract.online_async.sampling_version). Then the same weights score every training row
of the round, teacher-forced, with the trainer's own scoring (trainer.logps.token_logps at the
job's logps temperature, no top-p or top-k: the unprocessed distribution the trainer's ratio
compares with). These behaviour log-probs are GRPO's π_old and an online job's reference: they
are never recomputed with newer weights, which would silently remove the lag's correction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from contract.data import JsonlReader
from contract.online_async import sampling_version
from contract.spec import JobSpec
from trainer.modeling import load_policy, load_tokenizer
from trainer.online.rounds import OnlineData, Round
from trainer.recipes import make_recipe
from trainer.reference import _split_rows
from trainer.tokenize import ChatTokenizer, TokenSeq, collate

BEHAVIOUR_ROWS = 16  # rows per no-grad scoring forward


@dataclass(frozen=True)
class Solo:
    """The accelerator fields OnlineData reads, for a process that samples alone."""

    process_index: int = 0
    num_processes: int = 1


def behaviour_logps(
    model: torch.nn.Module, rows: list[TokenSeq], pad_id: int, temperature: float
) -> dict[TokenSeq, torch.Tensor]:
    """Each distinct row's completion-token log-probs under `model` (one-pass layout)."""
    from trainer.logps import token_logps

    unique = list(dict.fromkeys(rows))
    out: dict[TokenSeq, torch.Tensor] = {}
    with torch.no_grad():
        for i in range(0, len(unique), BEHAVIOUR_ROWS):
            group = unique[i : i + BEHAVIOUR_ROWS]
            batch = collate(group, pad_id, share_prompts=False)
            lp = token_logps(model, batch, temperature)
            out.update(zip(group, (v.cpu().clone() for v in _split_rows(lp, batch)), strict=True))
    return out


class RoundProducer:
    """Samples round after round of one job with a model it owns (load_version sets its
    weights), through the job's engine: transformers `generate` on that model, or vLLM loaded
    from it (trainer.sampling). The behaviour log-probs always come from the model itself.
    The prompt cursor is the only state: rounds come out in order, and a producer started at
    (round, cursor) gives what an uninterrupted one gives from there."""

    def __init__(self, spec: JobSpec, model_dir: str | Path, total: int, workdir: str | Path):
        assert spec.online is not None
        self.spec, self.model_dir, self.total = spec, Path(model_dir), total
        self.lag, self.every = spec.online.resolved_lag, spec.online.sample_every
        self.tokenizer = load_tokenizer(self.model_dir)
        self.recipe = make_recipe(spec)
        self.chat = ChatTokenizer(self.tokenizer, spec.max_prompt_length, spec.max_length)
        Path(workdir).mkdir(parents=True, exist_ok=True)
        reader = JsonlReader(spec.training_file)
        self.data = OnlineData(spec, self.recipe, self.chat, reader, Solo(), total, workdir)
        # its own device: on a GPU node the visible GPU (the trainer's too on a one-GPU node)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = load_policy(spec, self.model_dir).to(device).eval()
        self.version = 0  # the weights the model holds (0: none loaded yet)

    def start(self, r: int) -> int:
        """First step of round `r`."""
        return 1 + r * self.every

    def version_of(self, r: int) -> int:
        return sampling_version(self.start(r), self.lag)

    def rounds(self) -> int:
        return (self.total + self.every - 1) // self.every

    def load_version(self, version: int, state: dict[str, torch.Tensor]) -> None:
        from trainer.modeling import load_trainable_state_dict

        load_trainable_state_dict(self.model, state)
        self.version = version

    def produce(self, r: int) -> tuple[Round, float]:
        """Round `r` sampled by the loaded version, with its behaviour log-probs, and the
        seconds it took."""
        if self.version != self.version_of(r):
            raise RuntimeError(f"round {r} needs version {self.version_of(r)}, has {self.version}")
        t0 = time.perf_counter()
        new = self.data.sample_round(self.start(r), self.model, self.model_dir, self.tokenizer)
        rows = [s for ex in new.examples for s in self.recipe.sequences(ex)]
        new.behaviour = behaviour_logps(
            self.model, rows, self.tokenizer.pad_token_id, self.spec.logps_temperature
        )
        new.version = self.version
        new.cursor = self.data.cursor
        seconds = time.perf_counter() - t0
        new.stats["async/sampler_busy_time"] = seconds  # sampling, scoring and π_old's forward
        return new, seconds

    def close(self) -> None:
        self.data.close()
