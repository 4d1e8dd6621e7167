"""What an objective contributes to the shared training loop (trainer.train).

An objective turns records into examples, an examples' micro-batch into the sequences to
score, and scored sequences into a loss. Everything else (optimizer, syncing, checkpoints,
distribution) is the loop's, written once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypedDict, TypeVar, cast

import torch

from contract.spec import HumanlineParams, JobSpec
from trainer.losses import LossOutput
from trainer.losses.humanline import Draws, StepDraws
from trainer.plan import MicroBatch
from trainer.tokenize import ChatTokenizer, TokenBatch, TokenSeq, collate


class SequenceOptions(TypedDict):
    """The keywords every sequence-level loss (trainer.losses: DPO, KTO) takes from a step."""

    humanline: HumanlineParams | None
    length_normalize: bool
    generator: Draws


@dataclass
class LossContext:
    humanline: HumanlineParams | None
    length_normalize: bool
    generator: torch.Generator | None = None
    token_normalizer: float | None = None  # token-level objectives: global tokens per process
    kl_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None  # gathers across ranks
    # over the step's whole batch, whatever its split (trainer.stepwide): KTO's reference point
    # and humanline sample mode's bounds and draws
    z0: torch.Tensor | None = None
    draws: StepDraws | None = None
    # async GRPO with online.is_cap: the sampler's log-probs of the round's rows (row -> values)
    behaviour: dict | None = None
    is_cap: float | None = None

    def sequence_options(self, mb: MicroBatch | None = None) -> SequenceOptions:
        """The sequence losses' keywords for micro-batch `mb`: the step's draws where the
        trainer made them (sample mode), else the step's generator."""
        draws = self.draws.micro(mb.indices) if self.draws is not None and mb else None
        return SequenceOptions(
            humanline=self.humanline,
            length_normalize=self.length_normalize,
            generator=draws if draws is not None else self.generator,
        )


class Recipe(Protocol):
    token_level: ClassVar[bool]  # loss is a mean over the whole batch's tokens (DAPO)
    examples_per_prompt: ClassVar[int]  # online: examples one kept prompt yields

    # Examples from the training file's records, one at a time (a generator: the records
    # stream in and the examples go to a trainer.datastore.TokenStore, never all in memory).
    def build(self, fmt: str, records: Iterable[dict], chat: ChatTokenizer) -> Iterable[Any]: ...

    # An example as its token sequences and numbers, and back (trainer.datastore).
    def pack(self, example: Any) -> tuple[Sequence[TokenSeq], tuple[float, ...]]: ...

    def unpack(self, seqs: list[TokenSeq], numbers: tuple[float, ...]) -> Any: ...

    def from_samples(
        self,
        groups: Sequence[Sequence[Any]],
        prompt_ids: Sequence[list[int]],
        chat: ChatTokenizer,
        online: Any,
    ) -> list[Any]: ...

    def sequences(self, example: Any) -> list[TokenSeq]: ...

    def rows(
        self, examples: Sequence[Any], mb: MicroBatch, chat: ChatTokenizer
    ) -> list[TokenSeq]: ...

    # A micro-batch's rows as the tensors the model scores (trainer.tokenize.collate, unless
    # the objective lays rows out its own way: SFT's packing).
    def collate(
        self, rows: Sequence[TokenSeq], pad_id: int, share_prompts: bool | str
    ) -> TokenBatch: ...

    # Rows the loss needs but never differentiates through (KTO's mismatched pairs): the
    # policy scores them under no_grad, after `rows` (trainer.logps.batch_logps).
    def no_grad_rows(
        self, examples: Sequence[Any], mb: MicroBatch, chat: ChatTokenizer
    ) -> list[TokenSeq]: ...

    def loss(
        self,
        pol: torch.Tensor,
        ref: torch.Tensor,
        batch: TokenBatch,
        mb: MicroBatch,
        examples: Sequence[Any],
        ctx: LossContext,
    ) -> LossOutput: ...

    # What the loss needs from the step's whole batch before any micro-batch's loss (KTO's
    # z0), from every micro-batch's device batch (the aux rows' policy log-probs filled in)
    # and reference log-probs (trainer.stepwide).
    def whole_step(
        self, batches: Sequence[TokenBatch], refs: Sequence[torch.Tensor], ctx: LossContext
    ) -> None: ...


C = TypeVar("C")


class ObjectiveRecipe(Generic[C]):
    """What the recipes share: their objective's config `cfg` (the spec's objective, of type C,
    the one the registry picked the recipe for), a sequence-level loss, one example per kept
    prompt and no no-grad rows, unless a recipe says otherwise."""

    token_level: ClassVar[bool] = False
    examples_per_prompt: ClassVar[int] = 1
    cfg: C

    def __init__(self, spec: JobSpec):
        self.cfg = cast(C, spec.objective)

    def no_grad_rows(
        self, examples: Sequence[Any], mb: MicroBatch, chat: ChatTokenizer
    ) -> list[TokenSeq]:
        return []

    def whole_step(
        self, batches: Sequence[TokenBatch], refs: Sequence[torch.Tensor], ctx: LossContext
    ) -> None:
        pass

    def collate(
        self, rows: Sequence[TokenSeq], pad_id: int, share_prompts: bool | str
    ) -> TokenBatch:
        return collate(rows, pad_id, share_prompts)


def build_pairs(
    records: Iterable[dict], chat: ChatTokenizer
) -> Iterator[tuple[TokenSeq, TokenSeq]]:
    """(chosen, rejected) token sequences, a record at a time; pairs with an empty completion
    are dropped."""
    for r in records:
        seqs = chat.sequences(r["prompt"], [r["chosen"], r["rejected"]])
        if seqs is not None:
            yield seqs[0], seqs[1]


def fit_pair(
    chat: ChatTokenizer, prompt_ids: list[int], chosen, rejected
) -> tuple[TokenSeq, TokenSeq] | None:
    """Two sampled completions (anything with `token_ids`) of one prompt, fitted to max_length."""
    a, b = (
        chat.fit(prompt_ids, list(chosen.token_ids)),
        chat.fit(prompt_ids, list(rejected.token_ids)),
    )
    return None if a is None or b is None else (a, b)
