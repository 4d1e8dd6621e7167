"""Online rounds sampled asynchronously (contract.online_async): the trainer's side.

The trainer asks for round after round as a synchronous job does (OnlineData's interface), but
each comes from the sampler process (trainer.online.sampler_proc), sampled by version
max(1, a − L) for a round starting at step a. After every optimizer step the trainer hands
the new weights over (`after_step`). A checkpoint after step s holds the rounds already
sampled for steps s+1 .. s+L (they came from versions ≤ s, which no later checkpoint holds),
so a resumed job trains on exactly the rounds the uninterrupted one would have.

`pipeline` makes the sampler: `SamplerProcess` in a job; a test may swap in an in-process
implementation of the same schedule to check this one against.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from contract.online_async import (
    DEFAULT_SAMPLER_RESTARTS,
    DEFAULT_SAMPLER_TIMEOUT,
    SAMPLER_RESTARTS_ENV,
    SAMPLER_TIMEOUT_ENV,
    sampling_version,
)
from trainer.dtensors import _checkpoint_keys
from trainer.modeling import trainable_state_dict
from trainer.online.rounds import OnlineData, Round
from trainer.online.sampler_proc import SamplerProcess
from trainer.sampling.gathered import full_weights, is_sharded


def split_threads(budget: int, asked: int | None) -> tuple[int, int]:
    """(sampler, trainer) CPU threads out of `budget`: the sampler's as asked, else half."""
    sampler = min(asked or max(1, budget // 2), max(1, budget - 1)) if budget > 1 else 1
    return sampler, max(1, budget - sampler)


class AsyncOnlineData(OnlineData):
    pipeline: Any = SamplerProcess

    def __init__(self, *args, model_dir: str | Path, **kwargs):
        super().__init__(*args, **kwargs)
        self.model_dir, self.lag = str(model_dir), self.cfg.resolved_lag
        self.workdir = str(Path(kwargs.get("directory") or ".") / "sampler")
        self.pipe: Any = None  # rank 0's sampler
        self.started = False  # whether the sampler was started (every rank knows)
        every, total = self.cfg.sample_every, self.total
        # the versions that sample some round: the only ones published
        self.uses = {sampling_version(1 + r * every, self.lag) for r in range(-(-total // every))}
        self.pending: dict[int, Round] = {}  # rounds sampled before a checkpoint, not yet trained
        self.trainer_threads = torch.get_num_threads()
        self.sampler_threads = 1
        if self.acc.device.type == "cpu":  # the cores are split between the two processes
            self.sampler_threads, threads = split_threads(
                self.trainer_threads, self.cfg.sampler_threads
            )
            torch.set_num_threads(threads)
        self.trained = 0  # the last step after_step saw

    # ---- rounds --------------------------------------------------------------------------------
    def begin_round(self, step: int, policy, model_dir, tokenizer) -> dict[str, float]:
        r, _ = self.round_span(step)
        t0 = time.perf_counter()
        if r in self.pending:  # every rank loaded them from the checkpoint
            new = self.pending.pop(r)
        else:  # one sampler per job, on rank 0; the other ranks get its rounds
            pipe = self._pipe(step, policy)
            new = self._shared(pipe.take(r) if pipe is not None else None)
        wait = time.perf_counter() - t0
        self.round = new
        self._plan(new)
        return {
            **new.stats,
            "async/version": float(new.version),
            "async/lag": float(step - new.version),
            "async/wait_time": wait,
            "async/sampler_restarts": float(self.pipe.restarted if self.pipe else 0),
        }

    @staticmethod
    def shares(stats: dict[str, float], step_time: float) -> dict[str, float]:
        """A step's utilisation: the trainer's wait for its round and the sampler's time
        producing that round, as shares of the step's wall-clock (0 on steps that open no
        round). The sampler's share is above 1 when it is the slower side."""
        wall = max(step_time, 1e-9)
        return {
            "async/trainer_wait_share": stats.get("async/wait_time", 0.0) / wall,
            "async/sampler_busy_share": stats.get("async/sampler_busy_time", 0.0) / wall,
        }

    def behaviour(self) -> dict:
        """Row -> the sampler's log-probs of the current round's training rows."""
        assert self.round is not None and self.round.behaviour is not None
        return self.round.behaviour

    def round_rows(self, batch_for) -> dict[int, list]:
        """Step -> the rows of the current round's steps (every micro-batch)."""
        assert self.round is not None
        return {
            s: [row for m in range(self.accum) for row in batch_for(s, m).all_rows()]
            for s in range(self.round.start, self.round.end + 1)
        }

    def after_step(self, step: int, policy: torch.nn.Module) -> dict[str, float]:
        """Publish version step + 1 (the weights after update `step`) to the sampler."""
        self.trained = step
        version = step + 1
        pipe = self._pipe(version, policy)
        if version not in self.uses:  # no round is sampled by it: nothing to gather or send
            return {"async/publish_time": 0.0}
        t0 = time.perf_counter()
        state = self._weights(policy)  # a collective under FSDP2: every rank, every time
        if pipe is None:
            return {}
        pipe.publish(version, state)
        return {"async/publish_time": time.perf_counter() - t0}

    def _weights(self, policy: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The trainable weights, whole, under trainable_state_dict's names, on rank 0 (empty
        elsewhere). DDP: rank 0's own (every rank holds the same). FSDP2: gathered one tensor
        at a time (trainer.sampling.gathered), a collective every rank joins."""
        main = self.acc.is_main_process
        if not is_sharded(policy):
            return trainable_state_dict(policy, False) if main else {}
        names = _checkpoint_keys(policy)
        out = {}
        for key, full in full_weights(policy, list(names)):
            if main:
                out[names[key]] = full.detach().to("cpu", copy=True)
        return out

    def _shared(self, new: Round | None) -> Round:
        """Rank 0's round, on every rank."""
        if self.acc.num_processes == 1:
            assert new is not None
            return new
        box = [new]
        torch.distributed.broadcast_object_list(box, src=0)
        assert box[0] is not None
        return box[0]

    def _pipe(self, version: int, policy: torch.nn.Module):
        """The sampler on rank 0 (None on the others), started on first use with `version`
        (the policy's weights now; gathered by every rank under FSDP2)."""
        if not self.started:
            self.started = True
            initial = self._weights(policy)
            if not self.acc.is_main_process:
                return None
            held = [self.round, *self.pending.values()]
            last = max((r for r in held if r is not None), key=lambda r: r.index, default=None)
            self.pipe = self.pipeline(
                self.spec,
                self.model_dir,
                self.total,
                self.workdir,
                initial,
                version=version,
                first_round=last.index + 1 if last is not None else 0,
                cursor=last.cursor if last is not None else self.cursor,
                threads=self.sampler_threads,
                timeout=float(os.environ.get(SAMPLER_TIMEOUT_ENV, DEFAULT_SAMPLER_TIMEOUT)),
                restarts=int(os.environ.get(SAMPLER_RESTARTS_ENV, DEFAULT_SAMPLER_RESTARTS)),
            )
        return self.pipe

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.close()
            self.pipe = None
        torch.set_num_threads(self.trainer_threads)
        super().close()

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """After step s (the current round's): the rounds of steps s+1 .. s+L, sampled by
        versions ≤ s, are taken from the sampler and saved with the current round."""
        assert self.round is not None
        step, r = self.trained, self.round.index + 1
        while 1 + r * self.cfg.sample_every <= min(step + self.lag, self.total):
            if r not in self.pending:
                assert self.pipe is not None
                self.pending[r] = self.pipe.take(r)
            r += 1
        return {"cursor": self.cursor, "round": self.round, "pending": dict(self.pending)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.trained = self.round.end if self.round is not None else 0
        self.pending = dict(state.get("pending", {}))
