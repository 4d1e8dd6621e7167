"""SFT on conversations: one row per example, learned where its mask says (trainer.sft_data),
optionally packed; no reference model (JobSpec.needs_reference, trainer.reference)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from contract.spec import JobSpec, SFTConfig
from trainer.losses.sft import sft_loss
from trainer.recipes.base import LossContext, ObjectiveRecipe
from trainer.sft_data import as_messages, collate_packed, conversation_seq, from_spans, weight_spans
from trainer.tokenize import MaskedSeq, TokenBatch, TokenSeq, collate


class SFTRecipe(ObjectiveRecipe[SFTConfig]):
    token_level: ClassVar[bool] = True  # the mean over every learned token of the global batch

    def __init__(self, spec: JobSpec):
        super().__init__(spec)
        self.max_length = spec.max_length

    def build(self, fmt, records, chat):
        for r in records:
            seq = conversation_seq(chat, as_messages(r))
            if seq is not None:
                yield seq

    def pack(self, example: MaskedSeq):
        return (TokenSeq(example.prompt_ids, example.completion_ids),), weight_spans(example)

    def unpack(self, seqs, numbers):
        return from_spans(seqs[0], numbers)

    def from_samples(self, groups, prompt_ids, chat, online):
        raise RuntimeError("sft has no online data (JobSpec refuses data_source 'online')")

    def sequences(self, example: MaskedSeq):
        return [example]

    def rows(self, examples: Sequence[MaskedSeq], mb, chat):
        return [examples[i] for i in mb.indices]

    def collate(self, rows: Sequence[TokenSeq], pad_id: int, share_prompts) -> TokenBatch:
        """Packed rows, or one row per example; never the shared-prompt layout (every forward is
        one pass, so ranks agree on the number of forwards under FSDP too)."""
        if self.cfg.packing:
            return collate_packed(rows, pad_id, self.max_length)
        return collate(rows, pad_id, share_prompts=False)

    def loss(self, pol, ref, batch, mb, examples, ctx: LossContext):
        return sft_loss(pol, batch.mask.to(pol.device), ctx.token_normalizer)
