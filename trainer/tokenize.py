"""Turn normalised records (contract.data) into token ids, and token ids into tensors.

Every prompt goes through the tokenizer's chat template (a plain-string prompt becomes one
user turn), so training sees exactly what the served model sees. The completion's tokens are
what the template appends after the generation prompt. Prompt tokens are masked out of the
loss. Truncation is counted and reported, never silent: prompts lose their oldest tokens,
completions their tail; an example whose completion would be empty is dropped and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import torch

Messages = list[dict[str, str]]


@dataclass
class TruncationReport:
    examples: int = 0
    prompts_truncated: int = 0
    completions_truncated: int = 0
    dropped: int = 0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def any(self) -> bool:
        return bool(self.prompts_truncated or self.completions_truncated or self.dropped)


@dataclass(frozen=True)
class TokenSeq:
    """One prompt+completion to score: ids and where the completion starts."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]


@dataclass(frozen=True)
class MaskedSeq(TokenSeq):
    """A sequence whose completion is learned only where `weights` is 1 (SFT: a conversation's
    assistant turns of weight ≠ 0; the user turns between them are context). One weight per
    completion token; the mask of a batch is these weights (trainer.sft_data)."""

    weights: tuple[int, ...] = ()


def completion_weights(seq: TokenSeq) -> list[int]:
    """1 per completion token, or a MaskedSeq's own weights."""
    if isinstance(seq, MaskedSeq) and seq.weights:
        return list(seq.weights)
    return [1] * len(seq.completion_ids)


def _as_messages(value: str | Messages, role: str) -> Messages:
    return [{"role": role, "content": value}] if isinstance(value, str) else list(value)


class ChatTokenizer:
    """Applies the chat template and the length limits of one job."""

    def __init__(self, tokenizer, max_prompt_length: int, max_length: int):
        self.tok = tokenizer
        self.max_prompt_length = max_prompt_length
        self.max_length = max_length
        self.report = TruncationReport()

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def prompt(self, prompt: str | Messages) -> tuple[str, list[int]]:
        messages = _as_messages(prompt, "user")
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = self._ids(text)
        if len(ids) > self.max_prompt_length:
            self.report.prompts_truncated += 1
            ids = ids[-self.max_prompt_length :]
        return text, ids

    def completion(self, prompt: str | Messages, prompt_text: str, completion) -> list[int]:
        full = _as_messages(prompt, "user") + _as_messages(completion, "assistant")
        text = self.tok.apply_chat_template(full, tokenize=False)
        if not text.startswith(prompt_text):  # template re-renders history differently
            text = prompt_text + "".join(m["content"] for m in _as_messages(completion, "a"))
            text += self.tok.eos_token or ""
        return self._ids(text[len(prompt_text) :])

    def fit(self, prompt_ids: list[int], completion_ids: list[int]) -> TokenSeq | None:
        room = self.max_length - len(prompt_ids)
        if len(completion_ids) > room:
            self.report.completions_truncated += 1
            completion_ids = completion_ids[: max(room, 0)]
        if not completion_ids:
            self.report.dropped += 1
            return None
        return TokenSeq(tuple(prompt_ids), tuple(completion_ids))

    def sequences(self, prompt, completions: Sequence) -> list[TokenSeq] | None:
        """Tokenise one prompt with several completions; None if any must be dropped."""
        self.report.examples += 1
        text, prompt_ids = self.prompt(prompt)
        out = [self.fit(prompt_ids, self.completion(prompt, text, c)) for c in completions]
        return None if any(s is None for s in out) else out  # type: ignore[return-value]


@dataclass
class SharedPrefix:
    """Prompts that several rows share (a DPO pair, a GRPO group), run through the model once.

    A prefix is its prompt minus the last token; that token opens each row's suffix, so the
    suffix pass predicts every completion token. Keys and values of the prefix pass are
    gathered per row (`index`) and the suffix attends to them: the same attention as one
    pass over prompt + completion, for a quarter fewer tokens on a DPO batch of 64-token
    prompts and completions.
    """

    input_ids: torch.Tensor  # [P, Lp] right-padded
    attention_mask: torch.Tensor  # [P, Lp]
    index: torch.Tensor  # [N] the prefix row of each batch row
    lengths: torch.Tensor  # [N] prefix tokens of each row: where its suffix's positions start


@dataclass
class TokenBatch:
    """Right-padded sequences; `positions` are the logit rows that predict completion tokens.

    With a `prefix`, `input_ids` holds each row's suffix only (see SharedPrefix)."""

    input_ids: torch.Tensor  # [N, L]
    attention_mask: torch.Tensor  # [N, L]
    positions: torch.Tensor  # [T] indices into L (shared by all rows)
    labels: torch.Tensor  # [N, T] the token each kept position predicts
    mask: torch.Tensor  # [N, T] 1.0 on completion tokens
    prefix: SharedPrefix | None = None
    # Rows the policy scores without a graph (KTO's mismatched pairs, trainer.logps.batch_logps);
    # the reference scores them like any other row.
    aux: TokenBatch | None = None
    # The policy's no-grad log-probs of `aux`, when the step scored them first (trainer.stepwide:
    # KTO's z0 over the whole step); batch_logps then does not score them again.
    aux_logps: torch.Tensor | None = None
    # The sequences of the rows, in order: what a row's log-probs are keyed by when they are
    # kept for later (trainer.reference.Lookahead), whatever micro-batch scored them.
    rows: tuple[TokenSeq, ...] = ()
    # [K] flat indices of the mask's completion tokens, found on the host at collate time: the
    # output layer projects only these (padding costs no vocabulary-sized work), and the device
    # never has to be asked where they are (trainer.logps).
    kept: torch.Tensor | None = None
    # [N, L] packed rows (trainer.sft_data.collate_packed): each example's positions restart at
    # 0 and the model is given no 2-D mask, so transformers masks attention per example
    # (masking_utils.find_packed_sequence_indices); `attention_mask` then only counts tokens.
    position_ids: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.kept is None:
            self.kept = self.mask.reshape(-1).nonzero().squeeze(1)

    def all_rows(self) -> tuple[TokenSeq, ...]:
        """The rows, then the aux rows: the rows of batch_logps and row_mask."""
        return self.rows + (self.aux.rows if self.aux is not None else ())

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum().item())

    @property
    def seq_tokens(self) -> int:
        """Prompt + completion tokens of all rows (aux rows included), however they are run."""
        shared = int(self.prefix.lengths.sum()) if self.prefix is not None else 0
        aux = self.aux.seq_tokens if self.aux is not None else 0
        return int(self.attention_mask.sum()) + shared + aux

    def to(self, device: torch.device | str) -> TokenBatch:
        """This batch with every tensor (its prefix's and aux rows' too) on `device`. The step
        makes one such copy of each micro-batch, which the reference, the policy and the loss
        share: each host-to-device copy waits for the GPU, so one per tensor, not one per use."""
        moved = _tensors_to(self, device)
        if self.prefix is not None:
            moved.prefix = _tensors_to(self.prefix, device)
        if self.aux is not None:
            moved.aux = self.aux.to(device)
        return moved

    @property
    def row_width(self) -> int:
        """W of `row_mask()`: the wider of the rows' and the aux rows' kept positions."""
        aux = self.aux.mask.shape[1] if self.aux is not None else 0
        return max(self.mask.shape[1], aux)

    def row_mask(self) -> torch.Tensor:
        """[N + M, W] completion mask of the rows and then the aux rows (see batch_logps)."""
        if self.aux is None:
            return self.mask
        width = self.row_width

        def pad(m):
            return torch.nn.functional.pad(m, (0, width - m.shape[1]))

        return torch.cat([pad(self.mask), pad(self.aux.mask)])

    def row_kept(self) -> torch.Tensor:
        """[K + Ka] flat indices of `row_mask()`'s completion tokens, row by row (the rows, then
        the aux rows): `kept` re-based onto the [N + M, W] layout with integer arithmetic on
        whatever device the batch is, so nobody has to ask the device where the mask is set."""
        assert self.kept is not None  # set by __post_init__
        if self.aux is None:
            return self.kept
        assert self.aux.kept is not None
        n, t, ta = self.mask.shape[0], self.mask.shape[1], self.aux.mask.shape[1]
        width = self.row_width
        rows = self.kept // t * width + self.kept % t
        aux = (self.aux.kept // ta + n) * width + self.aux.kept % ta
        return torch.cat([rows, aux])


def _tensors_to(obj, device: torch.device | str):
    """A copy of dataclass `obj` whose tensor fields are on `device` (other fields as they are)."""
    values = {f.name: getattr(obj, f.name) for f in fields(obj)}
    return replace(obj, **{k: v.to(device) for k, v in values.items() if torch.is_tensor(v)})


def _pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attn[i, : len(row)] = 1
    return ids, attn


def collate(seqs: Sequence[TokenSeq], pad_id: int, share_prompts: bool | str = True) -> TokenBatch:
    """Pad to the longest sequence; keep logits only from the earliest completion onwards.

    Computing the output layer only where some row has a completion token saves most of the
    prompt's (vocab-sized) logits, the largest activation of a small model. Rows that share a
    prompt share one prefix pass (see SharedPrefix). `share_prompts="always"` takes the
    two-pass layout even when no prompt repeats, so every batch runs the same number of
    forwards (FSDP: forwards are collective, trainer.distributed).
    """
    prompts = list(dict.fromkeys(s.prompt_ids for s in seqs))
    always = share_prompts == "always"
    if always and min(len(p) for p in prompts) < 2:
        raise ValueError("a prompt of fewer than 2 tokens cannot take the shared-prefix layout")
    if share_prompts and (always or len(prompts) < len(seqs)) and min(len(p) for p in prompts) >= 2:
        return _collate_shared(seqs, prompts, pad_id)
    ids, attn = _pad([s.prompt_ids + s.completion_ids for s in seqs], pad_id)
    is_completion = torch.zeros_like(attn, dtype=torch.bool)
    for i, s in enumerate(seqs):
        span = slice(len(s.prompt_ids), len(s.prompt_ids) + len(s.completion_ids))
        is_completion[i, span] = torch.tensor(completion_weights(s), dtype=torch.bool)
    start = max(1, min(len(s.prompt_ids) for s in seqs))  # templates always emit a prompt
    positions = torch.arange(start - 1, ids.shape[1] - 1)
    return TokenBatch(
        ids, attn, positions, ids[:, start:], is_completion[:, start:].float(), rows=tuple(seqs)
    )


def _collate_shared(seqs: Sequence[TokenSeq], prompts: list, pad_id: int) -> TokenBatch:
    slot = {p: i for i, p in enumerate(prompts)}
    pre_ids, pre_attn = _pad([p[:-1] for p in prompts], pad_id)
    prefix = SharedPrefix(
        pre_ids,
        pre_attn,
        index=torch.tensor([slot[s.prompt_ids] for s in seqs], dtype=torch.long),
        lengths=torch.tensor([len(s.prompt_ids) - 1 for s in seqs], dtype=torch.long),
    )
    ids, attn = _pad([s.prompt_ids[-1:] + s.completion_ids for s in seqs], pad_id)
    positions = torch.arange(0, ids.shape[1] - 1)
    mask = attn[:, 1:].float()  # every suffix token after the first is a completion token
    for i, s in enumerate(seqs):
        if isinstance(s, MaskedSeq) and s.weights:
            mask[i, : len(s.completion_ids)] = torch.tensor(s.weights, dtype=mask.dtype)
    return TokenBatch(ids, attn, positions, ids[:, 1:], mask, prefix=prefix, rows=tuple(seqs))
