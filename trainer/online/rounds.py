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
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from accelerate.utils import gather_object

from trainer.online.pairs import Scored
from trainer.plan import BatchPlan, MicroBatch
from trainer.rewards import combine
from trainer.sampling import SamplingParams, make_sampler
from trainer.spec.job import JobSpec


class OfflineData:
    """A fixed example set and one plan for the whole run."""

    def __init__(self, examples: list, plan: BatchPlan):
        self.examples, self.plan = examples, plan

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
        pass


@dataclass
class Round:
    index: int
    start: int  # first step of the round
    end: int  # last step
    examples: list
    stats: dict[str, float] = field(default_factory=dict)


class OnlineData:
    def __init__(self, spec: JobSpec, recipe, chat, records: Sequence[dict], accelerator, total: int):
        self.spec, self.cfg, self.recipe, self.chat = spec, spec.online, recipe, chat
        self.acc, self.total = accelerator, total
        # The sampler sees the whole prompt, training its tokens cut to max_prompt_length: a
        # prompt that does not fit would be trained on a context it was not sampled from.
        rendered = [(r, chat.prompt(r["prompt"])[1]) for r in records]
        kept = [(r, ids) for r, ids in rendered if len(ids) < spec.max_prompt_length]
        self.records = [r for r, _ in kept]
        self.prompt_ids = [ids for _, ids in kept]  # rendered once, reused every round
        self.skipped = len(records) - len(self.records)
        if not self.records:
            raise ValueError(f"no prompt fits max_prompt_length={spec.max_prompt_length} tokens")
        self.reward = combine(self.cfg.rewards)
        self.sampler = None
        self.cursor = 0  # prompts consumed so far (over seeded epochs of the prompt file)
        self.round: Round | None = None
        self.plan: BatchPlan | None = None

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
        return self.round.end if self.round and self.round.start <= step <= self.round.end else step - 1

    # ---- a round ------------------------------------------------------------------------------
    def begin_round(self, step: int, policy: torch.nn.Module, model_dir, tokenizer) -> dict[str, float]:
        """Sample, score and build the examples of the round that starts at `step`."""
        cfg = self.cfg
        index = (step - 1) // cfg.sample_every
        end = min(step + cfg.sample_every - 1, self.total)
        needed = (end - step + 1) * self.spec.global_batch_size
        per_prompt = self.recipe.examples_per_prompt
        budget = math.ceil(cfg.prompt_budget * needed / per_prompt)
        if self.sampler is None:
            self.sampler = make_sampler(cfg.engine, model_dir, tokenizer, policy=policy)
        self.sampler.load_weights(policy)
        examples: list = []
        used = 0
        totals = {"sample_time": 0.0, "score_time": 0.0}
        scores: dict[str, list[float]] = {"mean": []}
        was_training = policy.training
        policy.eval()
        while len(examples) < needed and used < budget:
            picked = [self._next_index() for _ in range(min(needed // per_prompt + 1, budget - used))]
            seed = self.spec.seed * 7919 + index * 131 + used
            used += len(picked)
            groups = self._sample_and_score([self.records[i] for i in picked], seed, totals, scores)
            prompt_ids = [self.prompt_ids[i] for i in picked]
            examples.extend(self.recipe.from_samples(groups, prompt_ids, self.chat, cfg))
        policy.train(was_training)
        if len(examples) < self.spec.global_batch_size:
            raise RuntimeError(
                f"online round {index}: {len(examples)} training examples from {used} prompts, "
                f"fewer than one batch ({self.spec.global_batch_size}): the completions' rewards "
                f"rarely differ by tau={cfg.tau}. Check the reward sources, or lower tau."
            )
        self.round = Round(index, step, end, examples[:needed])
        self._plan()
        self.round.stats = {
            "round/index": float(index), "round/prompts": float(used),
            "round/examples": float(len(self.round.examples)),
            "round/sample_time": totals["sample_time"], "round/score_time": totals["score_time"],
            **{f"reward/{name}": sum(v) / max(len(v), 1) for name, v in scores.items()},
        }
        return self.round.stats

    def _sample_and_score(self, chunk: list[dict], seed: int, totals: dict, scores: dict) -> list[list[Scored]]:
        """G scored completions per prompt of `chunk`, `prompt_index` = position in `chunk`.

        Each process samples and scores its share of the prompts; the shares are gathered so
        every process builds the same examples.
        """
        cfg, acc = self.cfg, self.acc
        mine = list(range(acc.process_index, len(chunk), acc.num_processes))
        params = SamplingParams(n=cfg.num_samples, temperature=cfg.temperature, top_p=cfg.top_p,
                                max_new_tokens=cfg.max_new_tokens, seed=seed + acc.process_index)
        t0 = time.perf_counter()
        with torch.no_grad():
            sampled = self.sampler.generate([chunk[i]["prompt"] for i in mine], params)
        t1 = time.perf_counter()
        flat = [(i, c) for i, group in zip(mine, sampled) for c in group]
        reward, parts = self.reward.score([chunk[i]["prompt"] for i, _ in flat], [c.text for _, c in flat],
                                          [chunk[i] for i, _ in flat])
        totals["sample_time"] += t1 - t0
        totals["score_time"] += time.perf_counter() - t1
        local = [(Scored(i, c.text, tuple(c.token_ids), r), {n: v[k] for n, v in parts.items()})
                 for k, ((i, c), r) in enumerate(zip(flat, reward))]
        everyone = gather_object(local) if acc.num_processes > 1 else local
        groups: list[list[Scored]] = [[] for _ in chunk]
        for item, item_parts in everyone:
            groups[item.prompt_index].append(item)
            scores["mean"].append(item.score)
            for name, value in item_parts.items():
                scores.setdefault(name, []).append(value)
        return groups

    def _plan(self) -> None:
        r, acc = self.round, self.acc
        self.plan = BatchPlan(len(r.examples), self.spec.global_batch_size, self.spec.grad_accum,
                              acc.num_processes, acc.process_index, self.spec.seed + r.index, r.end - r.start + 1)

    def _next_index(self) -> int:
        """The next prompt of a seeded permutation per epoch of the prompt file."""
        n = len(self.records)
        epoch, pos = divmod(self.cursor, n)
        gen = torch.Generator().manual_seed(self.spec.seed * 1_000_003 + epoch)
        self.cursor += 1
        return int(torch.randperm(n, generator=gen)[pos])

    def close(self) -> None:
        """Stop the reward sources' helpers (the verifier's child process) and the engine."""
        self.reward.close()
        if self.sampler is not None and hasattr(self.sampler, "close"):
            self.sampler.close()

    # ---- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "round": self.round}

    def load_state_dict(self, state: dict) -> None:
        self.cursor, self.round = state["cursor"], state["round"]
        if self.round is not None:
            self._plan()

