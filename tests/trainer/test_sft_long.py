"""SFT tokenization is linear in a conversation's length (issue 37 #2): turns past what
`max_length` keeps are never rendered. Before, every assistant turn re-rendered the whole
prefix twice: 3,200 turns took 2.7 s, 12,800 turns 32 s, a 1 MiB line about 150 s."""

from __future__ import annotations

import time

import pytest

from trainer.sft_data import conversation_seq
from trainer.tokenize import ChatTokenizer


@pytest.fixture(scope="module")
def chat():
    from trainer.modeling import load_tokenizer, resolve_model

    return ChatTokenizer(load_tokenizer(resolve_model("tiny-llama")), 256, 512)


def turns(n: int) -> list[dict]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} says hello"}
        for i in range(n)
    ]


def test_a_ten_thousand_turn_conversation_tokenizes_in_bounded_time(chat):
    started = time.perf_counter()
    seq = conversation_seq(chat, turns(10_000))
    took = time.perf_counter() - started
    assert seq is not None and took < 1.0, took
    assert len(seq.prompt_ids) + len(seq.completion_ids) == chat.max_length  # cut to fit
    assert chat.report.completions_truncated == 1
    # the same row as a conversation just long enough to fill max_length: later turns
    # changed nothing but the time
    assert conversation_seq(chat, turns(200)) == seq
