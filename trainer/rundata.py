"""The run's examples: a fixed offline set read from the training file, or online rounds
sampled from a prompt file (trainer.online.rounds), and the run's length in optimizer steps."""

from __future__ import annotations

from pathlib import Path

from contract.data import JsonlReader
from contract.spec import JobSpec
from trainer.datastore import store_examples
from trainer.online.async_data import AsyncOnlineData
from trainer.online.rounds import OfflineData, OnlineData
from trainer.plan import BatchPlan
from trainer.runlog import RunLog
from trainer.tokenize import ChatTokenizer


def load_data(
    spec: JobSpec, recipe, chat: ChatTokenizer, acc, out_dir: Path, log: RunLog, model_dir: Path
) -> tuple[OfflineData | OnlineData, int]:
    """(the data, total optimizer steps). Read and tokenised a record at a time, the tokens
    kept in a memory-mapped file (trainer.datastore): the file is never held whole. Same
    examples, same order. The batch is split into one micro-batch until the trainer has chosen
    its split (set_accum)."""
    reader = JsonlReader(spec.training_file)
    fmt = reader.first()
    if spec.data_source == "online":
        if fmt not in spec.training_formats:
            raise ValueError(f"online jobs sample from prompt files, got {fmt}")
        assert spec.max_steps is not None  # JobSpec requires it of online jobs
        assert spec.online is not None
        if spec.online.is_async:  # a sampler process beside the trainer (contract.online_async)
            data: OnlineData = AsyncOnlineData(
                spec, recipe, chat, reader, acc, spec.max_steps, directory=out_dir,
                model_dir=model_dir,
            )
        else:
            data = OnlineData(spec, recipe, chat, reader, acc, spec.max_steps, directory=out_dir)
        log.event(
            "data", f"{len(data.records)} prompts ({fmt}) for online sampling", skipped=data.skipped
        )
        if data.skipped:
            log.event(
                "warning", f"{data.skipped} prompts longer than max_prompt_length are not sampled"
            )
        return data, spec.max_steps
    if fmt not in spec.training_formats:
        raise ValueError(
            f"{spec.objective.name} trains on {' or '.join(spec.training_formats)} data, got {fmt}"
        )
    store = store_examples(recipe, fmt, reader, chat, out_dir)
    examples = store.examples()
    report = chat.report.as_dict()
    log.event(
        "data", f"{len(examples)} training examples from {reader.records} {fmt} records", **report
    )
    if chat.report.any:
        log.event("warning", "some examples were truncated or dropped to fit max_length", **report)
    total = spec.total_steps(len(examples))
    plan = BatchPlan(
        len(examples),
        spec.examples_per_batch,
        spec.grad_accum or 1,
        acc.num_processes,
        acc.process_index,
        spec.seed,
        total,
    )
    return OfflineData(examples, plan, store), total
