"""Supervised fine-tuning data: a conversation as one row with a loss mask, and packed rows.

**One row per conversation.** Every assistant turn of weight ≠ 0 is a completion to learn,
its context every turn before it; all of them are learned in one forward over the whole
conversation (the standard choice: the same loss as one row per turn, without scoring each
prefix again). The chat template is applied to the conversation the way the served model sees
it: a turn's tokens are what the template appends to the rendering of the turns before it
(`add_generation_prompt=True`), exactly as trainer.tokenize does for a single completion, so a
`{"prompt", "completion"}` record and the same exchange as `{"messages": [...]}` give the same
tokens. Turns past what `max_length` keeps are not rendered at all (each rendering covers the
turns before it: a long conversation would cost the square of its turns).

The row is `MaskedSeq(prompt, completion, weights)`: the prompt is everything before the first
learned token (truncated to `max_prompt_length` from the left, like any prompt), the
completion runs to the last learned token (truncated from the right to `max_length`), and its
weights are 1 on learned assistant tokens, 0 on the user/system turns between them and on
assistant turns of weight 0. A template that renders earlier turns differently once later ones
follow (some drop past reasoning) cannot be split this way: such a conversation is dropped and
counted (`TruncationReport.notes`), never trained on tokens the model would not see.

**Packing** (`objective.packing`): a micro-batch's rows are laid end to end into rows of at most
`max_length` tokens, first fit in order. Each example's position ids restart at 0 and the model
gets no 2-D attention mask, so transformers builds a causal mask per example from the position
ids (`masking_utils.find_packed_sequence_indices`; flash-attention's varlen path on a GPU):
no token attends across examples, and every log-prob is the unpacked one. Padding after the
last example is its own segment, which no real token attends to.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainer.tokenize import ChatTokenizer, MaskedSeq, TokenBatch, TokenSeq, completion_weights

Message = dict  # {"role", "content", "weight"?}


def conversation_seq(chat: ChatTokenizer, messages: Sequence[Message]) -> MaskedSeq | None:
    """The conversation as one masked row (see the module docstring); None if it is dropped."""
    chat.report.examples += 1
    tok = chat.tok
    plain = [{"role": m["role"], "content": m["content"]} for m in messages]
    ids: list[int] = []
    weights: list[int] = []
    done = ""  # the text tokenised so far
    first: int | None = None  # the first learned token
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = tok.apply_chat_template(plain[:i], tokenize=False, add_generation_prompt=True)
        through = tok.apply_chat_template(plain[: i + 1], tokenize=False)
        if not before.startswith(done) or not through.startswith(before):
            chat.report.dropped += 1
            note = "conversations dropped: the chat template re-renders earlier turns"
            if note not in chat.report.notes:
                chat.report.notes.append(note)
            return None
        context = chat._ids(before[len(done) :])
        turn = chat._ids(through[len(before) :])
        learned = 1 if m.get("weight", 1) else 0
        ids += context + turn
        weights += [0] * len(context) + [learned] * len(turn)
        done = through
        if learned and turn:
            first = len(ids) - len(turn) if first is None else first
            if len(ids) - first > chat.max_length - min(first, chat.max_prompt_length):
                break  # the rest would be cut: not rendered (a cost quadratic in the turns)
    if 1 not in weights:
        chat.report.dropped += 1
        return None
    first, last = weights.index(1), len(weights) - weights[::-1].index(1)
    prompt, completion, w = ids[:first], ids[first:last], weights[first:last]
    if len(prompt) > chat.max_prompt_length:
        chat.report.prompts_truncated += 1
        prompt = prompt[-chat.max_prompt_length :]
    room = chat.max_length - len(prompt)
    if len(completion) > room:
        chat.report.completions_truncated += 1
        completion, w = completion[: max(room, 0)], w[: max(room, 0)]
    if 1 not in w:
        chat.report.dropped += 1
        return None
    return MaskedSeq(tuple(prompt), tuple(completion), tuple(w))


def as_messages(record: dict) -> list[Message]:
    """A normalised SFT record (contract.data: `messages`, or `prompt` + `completion`) as the
    conversation to learn: a string prompt is a user turn, a string completion an assistant
    turn, a completion's messages are learned as given."""
    if "messages" in record:
        return list(record["messages"])
    prompt, completion = record["prompt"], record["completion"]
    head = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if isinstance(completion, str):
        return head + [{"role": "assistant", "content": completion}]
    return head + list(completion)


def weight_spans(seq: MaskedSeq) -> tuple[float, ...]:
    """The learned runs of a row's completion as flat (start, end) pairs (trainer.datastore
    stores numbers, not per-token masks)."""
    spans: list[float] = []
    w = seq.weights
    for j, x in enumerate(w):
        if x and (j == 0 or not w[j - 1]):
            spans.append(j)
        if x and (j == len(w) - 1 or not w[j + 1]):
            spans.append(j + 1)
    return tuple(spans)


def from_spans(seq: TokenSeq, spans: Sequence[float]) -> MaskedSeq:
    w = [0] * len(seq.completion_ids)
    for a, b in zip(spans[0::2], spans[1::2], strict=True):
        w[int(a) : int(b)] = [1] * (int(b) - int(a))
    return MaskedSeq(seq.prompt_ids, seq.completion_ids, tuple(w))


def pack_rows(seqs: Sequence[TokenSeq], max_length: int) -> list[list[TokenSeq]]:
    """First fit, in order: each sequence goes into the first row with room for it."""
    rows: list[list[TokenSeq]] = []
    room: list[int] = []
    for s in seqs:
        n = len(s.prompt_ids) + len(s.completion_ids)
        for r, left in enumerate(room):
            if n <= left:
                rows[r].append(s)
                room[r] -= n
                break
        else:
            rows.append([s])
            room.append(max_length - n)
    return rows


def collate_packed(seqs: Sequence[TokenSeq], pad_id: int, max_length: int) -> TokenBatch:
    """The sequences packed into rows of at most `max_length` tokens (see the module
    docstring). `rows` keeps the sequences in packing order."""
    packed = pack_rows(seqs, max_length)
    width = max(sum(len(s.prompt_ids) + len(s.completion_ids) for s in row) for row in packed)
    ids = torch.full((len(packed), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(packed), width), dtype=torch.long)
    learn = torch.zeros((len(packed), width), dtype=torch.bool)
    positions = torch.zeros((len(packed), width), dtype=torch.long)
    for r, row in enumerate(packed):
        at = 0
        for s in row:
            n_p, n = len(s.prompt_ids), len(s.prompt_ids) + len(s.completion_ids)
            ids[r, at : at + n] = torch.tensor(s.prompt_ids + s.completion_ids)
            positions[r, at : at + n] = torch.arange(n)
            learn[r, at + n_p : at + n] = torch.tensor(completion_weights(s), dtype=torch.bool)
            at += n
        attn[r, :at] = 1
        positions[r, at:] = torch.arange(width - at)  # padding: a segment of its own
    # A completion token's predecessor is in its own example (every prompt has a token), so
    # the logits at j predict token j + 1 of the same example wherever the mask is set.
    return TokenBatch(
        ids,
        attn,
        torch.arange(0, width - 1),
        ids[:, 1:],
        learn[:, 1:].float(),
        rows=tuple(s for row in packed for s in row),
        position_ids=positions,
    )
