"""The micro-batch of a job that fits a given memory (issue 25, item 1), chosen from the
calibrated estimate (contract.memory): the trainer splits each process's share of the batch
with it, and the API's admission and cost estimate ask it what the trainer will do. Pure and
torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from contract.memory import GiB, MemoryEstimate, estimate_training_memory, keeps_softmax
from contract.shapes import ModelShape
from contract.spec import JobSpec

# The share of the memory available that a chosen micro-batch's estimate may fill. The
# calibration points sit at 0.95-1.12 of their measured peaks, and a GPU's caching allocator
# holds 3-10 % in freed blocks of the wrong size; 10 % covers both in the usual case, and a
# step that still runs out halves its micro-batch (issue 25, item 1), so a larger margin would
# only buy fewer refusals of what fits at the price of more accumulation steps for every job.
SAFETY_MARGIN = 0.10
# "auto" leaves activation checkpointing off once the largest micro-batch that fits without it
# holds this many tokens per device (rows with a graph × max_length): its GEMMs are saturated
# there, so checkpointing's larger micro-batch buys only its recompute (+33 % compute for full
# fine-tuning, +50 % for LoRA's 4N). Set from issue 38's 80 GB shapes, not measured on a GPU
# here: 8B LoRA at 8 × (512+512) fits 4 pairs without checkpointing (8,192 tokens, 61 GiB) and
# the 1.24 B model at 4 × (512+2048) fits 2 (10,240 tokens, 48 GiB); both now run unchecked.
AUTO_UNCHECKPOINTED_TOKENS = 6144


@dataclass(frozen=True)
class MicroBatchChoice:
    """A micro-batch for one process: `micro_examples` examples (`rows` sequences) per forward,
    `grad_accum` of them per optimizer step, and whether layers are checkpointed. `fits`
    False: not even the smallest configuration fits (its estimate is the one given)."""

    grad_accum: int
    micro_examples: int
    rows: int
    activation_checkpointing: bool
    estimate: MemoryEstimate
    fits: bool
    reason: str
    keep_softmax: bool = False  # the head keeps its softmax for backward (keeps_softmax)


def choose_micro_batch(
    spec: JobSpec,
    shape: ModelShape,
    available_bytes: int,
    *,
    world: int = 1,
    device: str = "cpu",
    training_file_bytes: int = 0,
    training_records: int = 0,
) -> MicroBatchChoice:
    """The largest micro-batch (fewest accumulation steps) of this process's share of the
    spec's global batch whose estimate fits `available_bytes` less SAFETY_MARGIN. A set
    `spec.grad_accum` is used as given; `activation_checkpointing` "auto" turns it on only when
    that lets a strictly larger micro-batch fit and the micro-batch without it holds fewer than
    AUTO_UNCHECKPOINTED_TOKENS tokens. Pure and fast (a few dozen estimates).
    ValueError when the batch does not split evenly over `world` processes (or grad_accum)."""
    examples = spec.examples_per_batch
    if examples % world:
        raise ValueError(
            f"{examples} {spec.batch_unit} per batch do not split over {world} processes"
        )
    per_process = examples // world
    if spec.grad_accum is not None:
        if per_process % spec.grad_accum:
            raise ValueError(
                f"{per_process} {spec.batch_unit} per process do not split into grad_accum "
                f"{spec.grad_accum} micro-batches"
            )
        sizes = [per_process // spec.grad_accum]
    else:
        sizes = [d for d in range(per_process, 0, -1) if per_process % d == 0]
    modes = {"off": (False,), "on": (True,), "auto": (False, True)}[spec.activation_checkpointing]
    budget = int(available_bytes * (1 - SAFETY_MARGIN))
    per_example = spec.rows_per_example

    def estimate(micro: int, ckpt: bool) -> MemoryEstimate:
        return estimate_training_memory(
            spec,
            shape,
            grad_accum=per_process // micro,
            checkpointing=ckpt,
            world=world,
            device=device,
            training_file_bytes=training_file_bytes,
            training_records=training_records,
        )

    def choice(micro: int, ckpt: bool, est: MemoryEstimate, fits: bool, why: str):
        rows = micro * per_example
        head = f"{micro} examples ({rows} rows) per micro-batch × {per_process // micro} steps"
        how = f"activation checkpointing {'on' if ckpt else 'off'}"
        reason = f"{head}, {how}: about {est.gib:.1f} GiB, {why}"
        keep = keeps_softmax(spec, shape, ckpt)
        return MicroBatchChoice(per_process // micro, micro, rows, ckpt, est, fits, reason, keep)

    gib = f"{available_bytes / GiB:.1f} GiB less {SAFETY_MARGIN:.0%}"
    best: dict[bool, tuple[int, MemoryEstimate]] = {}
    for ckpt in modes:
        for micro in sizes:  # largest first: the first that fits is the answer
            est = estimate(micro, ckpt)
            if est.total <= budget:
                best[ckpt] = (micro, est)
                break
    if not best:  # the least memory: one example, checkpointing unless the spec says off
        return choice(
            sizes[-1],
            modes[-1],
            estimate(sizes[-1], modes[-1]),
            False,
            f"above {gib}: nothing smaller",
        )
    # "auto": checkpointing only when it lets a strictly larger micro-batch fit and the one
    # without it is too small to keep the device busy (AUTO_UNCHECKPOINTED_TOKENS)
    ckpt = False not in best or (
        True in best
        and best[True][0] > best[False][0]
        and best[False][0] * per_example * spec.max_length < AUTO_UNCHECKPOINTED_TOKENS
    )
    micro, est = best[ckpt]
    given = "grad_accum as set" if spec.grad_accum is not None else "the largest that fits"
    return choice(micro, ckpt, est, True, f"within {gib} ({given})")
