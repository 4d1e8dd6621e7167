"""Training files are read a record at a time into a compact token store (issue 14: the
trainer held the whole file at ~12x its size). The examples, their order and the first steps'
batches are exactly those of the whole-file path (kept here as the reference), and building
the store holds a small fraction of the file in memory."""

from __future__ import annotations

import json
import random
import tracemalloc

import pytest
import torch

from contract.data import JsonlReader, read_jsonl
from trainer.datastore import StoredExamples, store_examples
from trainer.modeling import load_tokenizer, resolve_model
from trainer.plan import BatchPlan
from trainer.recipes import make_recipe
from trainer.tokenize import ChatTokenizer, collate
from trainer.train import Trainer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model("tiny-llama"))


def _whole_file(spec, tokenizer) -> list:
    """The trainer's data path before the store: every record, then every example, listed."""
    recipe = make_recipe(spec)
    chat = ChatTokenizer(tokenizer, spec.max_prompt_length, spec.max_length)
    fmt, records = read_jsonl(spec.training_file)
    return list(recipe.build(fmt, records, chat)), chat.report


CASES = [("dpo", "pref"), ("kto", "pref"), ("kto", "unpaired"), ("grpo", "pref")]


@pytest.mark.parametrize("objective,data", CASES)
def test_stored_examples_are_the_whole_file_examples(
    make_spec, pref_file, unpaired_file, tokenizer, objective, data
):
    path = pref_file if data == "pref" else unpaired_file
    spec = make_spec(objective=objective, training_file=str(path), max_prompt_length=20)
    expected, expected_report = _whole_file(spec, tokenizer)
    recipe = make_recipe(spec)
    chat = ChatTokenizer(tokenizer, spec.max_prompt_length, spec.max_length)
    reader = JsonlReader(str(path))
    store = store_examples(recipe, reader.first(), reader, chat)
    examples = store.examples()
    assert len(examples) == len(expected) and list(examples) == expected
    assert examples[-1] == expected[-1] and examples[1:3] == expected[1:3]
    assert chat.report == expected_report  # truncation counted as before (prompts cut at 20)
    assert expected_report.prompts_truncated > 0
    store.close()


@pytest.mark.parametrize("objective", ["dpo", "kto", "grpo"])
def test_the_first_steps_batches_are_unchanged(tmp_path, make_spec, tokenizer, objective):
    """The trainer's own micro-batches (plan, rows, KTO's mismatched rows, collation) for the
    first steps equal those built from the whole-file example list with the same seed."""
    spec = make_spec(objective=objective, grad_accum=2, seed=3, quality_sample=0)
    trainer = Trainer(spec, tmp_path / "out", progress=False)
    assert isinstance(trainer.data.examples, StoredExamples)  # not a list of the whole file
    expected, _ = _whole_file(spec, tokenizer)
    plan = BatchPlan(len(expected), spec.examples_per_batch, 2, 1, 0, spec.seed, trainer.total)
    recipe, chat, pad = trainer.recipe, trainer.chat, tokenizer.pad_token_id
    for step in (1, 2, 3):
        for micro in (0, 1):
            mb = plan.micro(step, micro)
            assert mb == trainer.data.micro(step, micro)
            want = collate(recipe.rows(expected, mb, chat), pad, trainer.share_prompts)
            got = trainer.batch_for(step, micro)
            for name in ("input_ids", "attention_mask", "positions", "labels", "mask"):
                assert torch.equal(getattr(got, name), getattr(want, name)), (step, micro, name)
            aux = recipe.no_grad_rows(expected, mb, chat)
            assert (got.aux is None) == (not aux)
            if aux:
                want_aux = collate(aux, pad, trainer.share_prompts)
                assert torch.equal(got.aux.input_ids, want_aux.input_ids)
    trainer.data.close()


def test_building_the_store_holds_a_fraction_of_the_file(tmp_path, make_spec, tokenizer):
    """Python's own allocations while a ~2 MB file is read and tokenised: under half the file
    (one-time tokenizer caches included) and a tenth of the whole-file path's (records and
    examples, many times the file)."""
    rng = random.Random(0)
    words = "the of and to in is that for it as with was on be by at this from".split()
    path = tmp_path / "big.jsonl"
    with open(path, "w") as fh:
        while fh.tell() < 2_000_000:
            text = lambda n: " ".join(rng.choice(words) for _ in range(n))  # noqa: E731
            fh.write(json.dumps({"prompt": text(60), "chosen": text(40), "rejected": text(30)}))
            fh.write("\n")
    size = path.stat().st_size
    spec = make_spec(training_file=str(path), max_length=256, max_prompt_length=128)
    recipe = make_recipe(spec)

    def peak(load) -> int:
        chat = ChatTokenizer(tokenizer, spec.max_prompt_length, spec.max_length)
        tracemalloc.start()
        try:
            kept = load(chat)
            return tracemalloc.get_traced_memory()[1], kept
        finally:
            tracemalloc.stop()

    def streamed(chat):
        reader = JsonlReader(str(path))
        return store_examples(recipe, reader.first(), reader, chat, tmp_path)

    new, store = peak(streamed)
    old, examples = peak(lambda chat: list(recipe.build(*read_jsonl(str(path)), chat)))
    assert len(store) == len(examples) > 1000
    assert old > 4 * size  # what the trainer held before (the test's reference path)
    assert new < size / 2 and new < old / 10, (new, old, size)
    assert store.nbytes < size / 4  # int32 ids of the truncated sequences, not the text
    store.close()


def test_online_prompts_are_read_by_offset(tmp_path, make_spec, tokenizer):
    """An online job keeps each prompt's line offset and rendered ids (memory-mapped), not the
    records: the records it samples from and their ids are the whole-file ones."""
    from trainer.online.rounds import OnlineData

    rows = [
        {"prompt": f"What is {i} + {i}?" + " pad" * (i % 7) * 9, "answer": str(2 * i)}
        for i in range(40)
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = make_spec(
        training_file=str(path),
        objective="grpo",
        variant="online",
        max_steps=2,
        batch_size=8,
        max_length=96,
        max_prompt_length=40,
        online={"engine": "hf"},
    )
    chat = ChatTokenizer(tokenizer, spec.max_prompt_length, spec.max_length)
    data = OnlineData(spec, make_recipe(spec), chat, JsonlReader(str(path)), None, 2, tmp_path)
    _, records = read_jsonl(str(path))
    kept = [(r, chat.prompt(r["prompt"])[1]) for r in records]
    kept = [(r, ids) for r, ids in kept if len(ids) < spec.max_prompt_length]
    assert 0 < len(kept) < len(records) and data.skipped == len(records) - len(kept)
    assert [data.records[i] for i in range(len(data.records))] == [r for r, _ in kept]
    assert [data.prompt_ids[i] for i in range(len(data.prompt_ids))] == [ids for _, ids in kept]
    data.close()
