"""Where the trainer's examples come from: a fixed offline set, or online rounds.

Online (paper, Algorithm 1): a round covers `sample_every` steps. At its first step the
current policy samples G completions for a stream of prompts, the job's reward sources score
them, and the objective's recipe keeps what it can learn from (DPO: best/worst pairs whose
spread is ≥ τ; KTO: those pairs split; GRPO: groups with raw scores). Prompts are drawn in
chunks until the round has enough examples for its steps, or its prompt budget runs out.
Both sources answer the same questions for the loop: which examples and micro-batch a step
uses, and where the current segment (the span one reference may cover) ends.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object

from contract.data import JsonlReader
from contract.spec import JobSpec
from trainer.datastore import PromptIds, RecordsAt, TokenStore
from trainer.online.pairs import Scored
from trainer.plan import BatchPlan, MicroBatch
from trainer.rewards import combine
from trainer.sampling import Sampler, SamplingParams, make_sampler
from trainer.sampling.vllm_params import engine_options
from trainer.seeds import derive_seed


class OfflineData:
    """A fixed example set and one plan for the whole run; `store` (trainer.datastore) holds
    the examples' tokens when they were read from a file."""

    def __init__(self, examples: Sequence, plan: BatchPlan, store: TokenStore | None = None):
        self.examples, self.plan, self.store = examples, plan, store

    @property
    def accum(self) -> int:
        return self.plan.grad_accum

    def set_accum(self, accum: int) -> None:
        """Split every step's batch into `accum` micro-batches from now on (the trainer's
        micro-batch choice, or its halving after an out-of-memory error)."""
        self.plan = replace(self.plan, grad_accum=accum)

    def needs_round(self, step: int) -> bool:
        return False

    def micro(self, step: int, micro: int) -> MicroBatch:
        return self.plan.micro(step, micro)

    def segment_end(self, step: int) -> int:
        return self.plan.total_steps

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


@dataclass
class Round:
    index: int
    start: int  # first step of the round
    end: int  # last step
    examples: list
    stats: dict[str, float] = field(default_factory=dict)
    # async (trainer.online.producer): the policy version that sampled the round, its log-probs
    # of every training row (row -> completion-token log-probs), and the prompt cursor after it
    version: int = 0
    behaviour: dict | None = None
    cursor: int = 0


class OnlineData:
    def __init__(
        self,
        spec: JobSpec,
        recipe,
        chat,
        records: JsonlReader,
        accelerator,
        total: int,
        directory: str | Path | None = None,
    ):
        if spec.online is None:  # JobSpec fills it for every online job
            raise ValueError("online data needs the spec's online settings")
        self.spec, self.cfg, self.recipe, self.chat = spec, spec.online, recipe, chat
        self.acc, self.total = accelerator, total
        # The sampler sees the whole prompt, training its tokens cut to max_prompt_length: a
        # prompt that does not fit would be trained on a context it was not sampled from.
        # The file is read a record at a time: a kept record is its line's offset (read again
        # when sampled), its rendered prompt ids go to a memory-mapped token file (rendered
        # once, reused every round): never the whole file in memory (trainer.datastore).
        fmt = records.first()
        self.records = RecordsAt(records.path, fmt)
        self.prompt_ids = PromptIds(directory)
        for r in records:
            ids = chat.prompt(r["prompt"])[1]
            if len(ids) < spec.max_prompt_length:
                self.records.append(records.offset)
                self.prompt_ids.append(ids)
        self.skipped = records.records - len(self.records)
        if not self.records:
            raise ValueError(f"no prompt fits max_prompt_length={spec.max_prompt_length} tokens")
        self.reward = combine(self.cfg.rewards)
        self.sampler: Sampler | None = None  # started at the first round
        self.sampler_started: dict[str, object] = {}  # set when the sampler starts
        self.cursor = 0  # prompts consumed so far (over seeded epochs of the prompt file)
        self.round: Round | None = None
        self.plan: BatchPlan | None = None
        self.accum = spec.grad_accum or 1  # micro-batches per step (set_accum)

    def set_accum(self, accum: int) -> None:
        """Split every step's batch into `accum` micro-batches from now on."""
        self.accum = accum
        if self.plan is not None:
            self.plan = replace(self.plan, grad_accum=accum)

    # ---- the loop's questions --------------------------------------------------------------
    def needs_round(self, step: int) -> bool:
        return self.round is None or step > self.round.end

    @property
    def examples(self) -> list:
        return self.round.examples if self.round else []

    def micro(self, step: int, micro: int) -> MicroBatch:
        assert self.round is not None and self.plan is not None and step <= self.round.end
        return self.plan.micro(step - self.round.start + 1, micro)

    def segment_end(self, step: int) -> int:
        return (
            self.round.end
            if self.round and self.round.start <= step <= self.round.end
            else step - 1
        )

    # ---- a round ------------------------------------------------------------------------------
    def begin_round(
        self, step: int, policy: torch.nn.Module, model_dir, tokenizer
    ) -> dict[str, float]:
        """Sample, score and build the examples of the round that starts at `step`: it is
        the current round from now on."""
        self.round = self.sample_round(step, policy, model_dir, tokenizer)
        self._plan(self.round)
        return self.round.stats

    def round_span(self, step: int) -> tuple[int, int]:
        """(index, last step) of the round that starts at `step`."""
        every = self.cfg.sample_every
        return (step - 1) // every, min(step + every - 1, self.total)

    def sample_round(self, step: int, policy: torch.nn.Module, model_dir, tokenizer) -> Round:
        """The round that starts at `step`, sampled by `policy` (advances the prompt cursor)."""
        cfg = self.cfg
        index, end = self.round_span(step)
        batch = self.spec.examples_per_batch  # GRPO: groups, not sequences
        needed = (end - step + 1) * batch
        per_prompt = self.recipe.examples_per_prompt
        budget = math.ceil(cfg.prompt_budget * needed / per_prompt)
        if self.sampler is None:
            self.sampler = make_sampler(
                cfg.engine,
                model_dir,
                tokenizer,
                policy=policy,
                vllm_options=engine_options(self.spec),
            )
            self.sampler_started = getattr(self.sampler, "description", {"engine": "hf"})
        sampler = self.sampler
        sampler.load_weights(policy)
        examples: list = []
        used = 0
        totals = {"sample_time": 0.0, "score_time": 0.0, "sampled_tokens": 0.0}
        scores: dict[str, list[float]] = {"mean": []}
        was_training = policy.training
        policy.eval()
        while len(examples) < needed and used < budget:
            short = math.ceil((needed - len(examples)) / per_prompt)  # the prompts still due
            picked = [self._next_index() for _ in range(min(short, budget - used))]
            seed = derive_seed(self.spec.seed, "sample", index, used)
            used += len(picked)
            groups = self._sample_and_score(
                sampler, [self.records[i] for i in picked], seed, totals, scores
            )
            prompt_ids = [self.prompt_ids[i] for i in picked]
            examples.extend(self.recipe.from_samples(groups, prompt_ids, self.chat, cfg))
        policy.train(was_training)
        # vLLM: hand its memory to training until the next round; transformers: drop the copy
        # a sharded policy was gathered into (trainer.sampling.gathered)
        if hasattr(sampler, "sleep"):
            sampler.sleep()
        if len(examples) < batch:
            raise RuntimeError(
                f"online round {index}: {len(examples)} training examples from {used} prompts, "
                f"fewer than one batch ({batch}): the completions' rewards "
                f"rarely differ by tau={cfg.tau}. Check the reward sources, or lower tau."
            )
        new = Round(index, step, end, examples[:needed])
        new.stats = {
            "round/index": float(index),
            "round/prompts": float(used),
            "round/examples": float(len(new.examples)),
            "round/sample_time": totals["sample_time"],
            "round/score_time": totals["score_time"],
            "round/sampled_tokens": totals["sampled_tokens"],
            **{f"reward/{name}": sum(v) / max(len(v), 1) for name, v in scores.items()},
        }
        return new

    def _sample_and_score(
        self, sampler: Sampler, chunk: list[dict], seed: int, totals: dict, scores: dict
    ) -> list[list[Scored]]:
        """G scored completions per prompt of `chunk`, `prompt_index` = position in `chunk`.

        Each process samples and scores its share of the prompts; the shares are gathered so
        every process builds the same examples.
        """
        cfg, acc = self.cfg, self.acc
        mine = list(range(acc.process_index, len(chunk), acc.num_processes))
        params = SamplingParams(
            n=cfg.num_samples,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens,
            seed=derive_seed(seed, "rank", acc.process_index),
        )
        t0 = time.perf_counter()
        with torch.no_grad():
            sampled = sampler.generate([chunk[i]["prompt"] for i in mine], params)
        t1 = time.perf_counter()
        flat = [(i, c) for i, group in zip(mine, sampled, strict=False) for c in group]
        reward, parts = self.reward.score(
            [chunk[i]["prompt"] for i, _ in flat],
            [c.text for _, c in flat],
            [chunk[i] for i, _ in flat],
        )
        totals["sample_time"] += t1 - t0
        totals["score_time"] += time.perf_counter() - t1
        local = [
            (Scored(i, c.text, tuple(c.token_ids), r), {n: v[k] for n, v in parts.items()})
            for k, ((i, c), r) in enumerate(zip(flat, reward, strict=False))
        ]
        everyone = gather_object(local) if acc.num_processes > 1 else local
        groups: list[list[Scored]] = [[] for _ in chunk]
        for item, item_parts in everyone:
            groups[item.prompt_index].append(item)
            totals["sampled_tokens"] += len(item.token_ids)  # every rank's: the job's cost
            scores["mean"].append(item.score)
            for name, value in item_parts.items():
                scores.setdefault(name, []).append(value)
        return groups

    def _plan(self, r: Round) -> None:
        """The batch plan of round `r` (the current one)."""
        acc = self.acc
        self.plan = BatchPlan(
            len(r.examples),
            self.spec.examples_per_batch,
            self.accum,
            acc.num_processes,
            acc.process_index,
            derive_seed(self.spec.seed, "round", r.index),
            r.end - r.start + 1,
        )

    def _next_index(self) -> int:
        """The next prompt of a seeded permutation per epoch of the prompt file."""
        n = len(self.records)
        epoch, pos = divmod(self.cursor, n)
        gen = torch.Generator().manual_seed(derive_seed(self.spec.seed, "prompts", epoch))
        self.cursor += 1
        return int(torch.randperm(n, generator=gen)[pos])

    def close(self) -> None:
        """Stop the reward sources' helpers (the verifier's child process) and the engine."""
        self.reward.close()
        if self.sampler is not None and hasattr(self.sampler, "close"):
            self.sampler.close()
        self.records.close()
        self.prompt_ids.close()

    # ---- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "round": self.round}

    def load_state_dict(self, state: dict) -> None:
        self.cursor, self.round = state["cursor"], state["round"]
        if self.round is not None:
            self._plan(self.round)
