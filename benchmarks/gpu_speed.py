"""The speed parts of benchmarks/gpu_smoke.py: trainers stepped in turn in one process, so a
figure is a ratio of medians measured side by side (machines are noisy; ratios are not).

  overhead  humanline ÷ offline step time (full, LoRA), what scoping the reference's
            eval-mode switch to the dropout modules saves (trainer.reference._noisy), and
            what one device copy of each micro-batch saves (trainer.tokenize.TokenBatch.to)
  layout    one forward pass ÷ the shared prompt pass (trainer.distributed)
"""

from __future__ import annotations

import statistics


def _per_use_copies(trainer):
    """`trainer` stepping as it did before TokenBatch.to: the host batch goes on to the
    reference, the policy and the recipe, and each copies the tensors it uses (a blocking
    copy each)."""
    from trainer.tokenize import TokenBatch

    class PerUseCopies(TokenBatch):
        def to(self, device):
            return self

    own = trainer.batch_for
    trainer.batch_for = lambda step, micro: PerUseCopies(**vars(own(step, micro)))
    return trainer


def _interleaved(a, b, steps: int) -> float:
    """b's median step time ÷ a's, the two stepped in turn (alternating who goes first), after
    two warm-up steps (allocator, kernels, autotuning)."""
    t_a, t_b = [], []
    for i in range(1, steps + 1):
        first, second = (a, b) if i % 2 else (b, a)
        t1, t2 = first.step(i)["step_time"], second.step(i)["step_time"]
        if i > min(2, steps - 1):
            t_a.append(t1 if first is a else t2)
            t_b.append(t2 if first is a else t1)
    return statistics.median(t_b) / statistics.median(t_a)


def part_overhead(r, s) -> None:
    from trainer.train import Trainer

    # On an H100 a median of 12 interleaved ~0.2 s steps moved by +-10 % between runs; 40 held
    steps = s.steps if s.self_check else max(s.steps, 40)

    def trainer(variant: str, adapter: str, tag: str):
        out = s.work / f"oh-{tag}-{adapter}"
        return Trainer(s.spec(variant, adapter, max_steps=steps), out, progress=False)

    for adapter in ("full", "lora"):
        off, hl = trainer("offline", adapter, "off"), trainer("offline+humanline", adapter, "hl")
        ratio = _interleaved(off, hl, steps)
        r.figure(
            f"overhead.{adapter}.humanline_over_offline", ratio, "<= 1.05", ratio <= 1.05,
            gpu_only=True,
        )  # fmt: skip
        del off, hl
        # What trainer.reference._noisy saves: a humanline run scoring under model.eval() and
        # back (every module switched, as before it) over one switching only the dropout.
        scoped, walk = (trainer("offline+humanline", adapter, x) for x in ("scoped", "walk"))
        walk.reference.noisy = [walk.model]
        r.figure(f"overhead.{adapter}.model_walk_over_scoped", _interleaved(scoped, walk, steps))
        del scoped, walk
        # What one device copy of each micro-batch saves: offline (its reference model, or
        # the adapter-off policy, scores the batch too), per-use copies over one copy.
        one, per_use = (trainer("offline", adapter, x) for x in ("one-copy", "per-use"))
        ratio = _interleaved(one, _per_use_copies(per_use), steps)
        r.figure(f"overhead.{adapter}.per_use_copies_over_one_copy", ratio)
        del one, per_use


def part_layout(r, s) -> None:
    """Rows that share a prompt (DPO's chosen and rejected) get a prompt pass of their own on
    the CPU only (trainer.distributed): one pass ÷ the shared pass, interleaved, at two batch
    sizes. (Step 1's batch, built as the trainer starts, keeps its default layout: warm-up.)"""
    from trainer.train import Trainer

    for batch in (s.batch, 4 * s.batch):
        shared, one = (
            Trainer(s.spec(batch_size=batch), s.work / f"layout-{batch}-{x}", progress=False)
            for x in ("shared", "one")
        )
        shared.share_prompts, one.share_prompts = True, False
        ratio = _interleaved(shared, one, s.steps)
        r.figure(
            f"layout.b{batch}.one_pass_over_shared", ratio, "<= 1.0", ratio <= 1.0, gpu_only=True
        )
        del shared, one
