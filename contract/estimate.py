"""A job's cost before launch (issue 27 item 4; DESIGN.md §5 "Notifications and estimates").

Torch-free (the API imports it). From a resolved spec, the base model's shape, the training
file's size and the device class the job would run on, `estimate_job` predicts:

* steps (the spec's `total_steps`, exact) and the micro-batch (`choose_micro_batch` at the
  device's memory, what the trainer will choose);
* training tokens: rows × tokens per row, every row capped at `max_length`. Tokens are NOT
  counted at upload (the API never loads a tokenizer): a row's tokens are approximated from
  the file's bytes per record ÷ the base model's bytes per token, plus the chat template's
  tokens per row, both calibrated on the bundled tokenizers (contract/throughput.json;
  `tokens_method` says so in every estimate);
* memory per process and the GPUs (processes) the job needs;
* wall-clock and GPU-hours: FLOPs per token (6N full fine-tuning, 4N LoRA, + 2N for the
  reference / lookahead forward, + 2N when layers are recomputed, + attention 12·L·h·T) over
  the device's peak × the utilisation the GPU proof measured (contract/throughput.json: `hfu`,
  from its MFU), a step at least the device's fixed cost per step, plus the process start;
  online jobs add sampling (2N per generated token, every sample max_new_tokens long: an
  upper bound, at the table's `sampling_mfu`), and `sampling_share` is its part of the
  wall-clock; offline jobs add tokenizing the whole file before step 1
  (TOKENIZE_BYTES_PER_SECOND, a measured worst case).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from contract.memory import GiB
from contract.micro_batch import choose_micro_batch
from contract.shapes import ModelShape
from contract.spec import JobSpec

THROUGHPUT_FILE = Path(__file__).with_name("throughput.json")
# An offline job tokenizes its whole training file, on the worker's CPU, before step 1. Rate
# measured with tiny-llama's chat template on this repository's 2-core CI machine (issue 37):
# 2.0-2.7 MB/s for ordinary SFT conversations, 1.36 MB/s for the worst line uploads admit (1 MiB,
# 1024 turns, all but the last of weight 0); the estimate takes 1 MB/s, an upper bound.
TOKENIZE_BYTES_PER_SECOND = 1.0e6
PAIRED_FORMATS = ("preference",)  # a record holds the prompt once and two completions


@lru_cache(maxsize=1)
def throughput_table() -> dict[str, Any]:
    """contract/throughput.json (read once)."""
    return json.loads(THROUGHPUT_FILE.read_text())


def device_kinds() -> tuple[str, ...]:
    return tuple(throughput_table()["devices"])


def _per_model(table: str, base_model: str) -> float:
    values = throughput_table()[table]
    return float(values.get(base_model, values["default"]))


class JobEstimate(BaseModel):
    """What a job will cost, predicted before it runs (see the module docstring)."""

    device: str = Field(description="The device class priced (JOB_DEVICE_KIND): cpu, h100, h200.")
    processes: int = Field(description="Training processes of the job (one per GPU).")
    gpus: int = Field(description="GPUs the job needs (0 on CPU workers).")
    memory_available_gib: float = Field(description="Memory per process the choice fits into.")
    micro_batch: int = Field(description="Examples per forward, per process.")
    grad_accum: int
    activation_checkpointing: bool
    memory_gib_per_process: float = Field(description="contract.memory's peak estimate.")
    memory_fits: bool
    steps: int = Field(description="Optimizer steps.")
    examples: int = Field(description="Training examples in the file (offline) or trained.")
    tokens: int = Field(description="Tokens through the policy in training, all steps.")
    tokens_per_step: int
    tokens_method: str = Field(description="How tokens were counted or approximated.")
    sampled_tokens: int = Field(0, description="Online: tokens generated (an upper bound).")
    train_flops: float
    train_seconds: float
    sampling_seconds: float = 0.0
    tokenize_seconds: float = Field(
        0.0,
        description="Offline: tokenizing the whole training file before step 1 (its bytes "
        "at a measured worst-case rate, TOKENIZE_BYTES_PER_SECOND).",
    )
    startup_seconds: float
    wall_clock_seconds: float
    gpu_hours: float
    sampling_share: float = Field(0.0, description="Online: sampling's share of the wall-clock.")
    throughput_source: str = Field(description="Where the device's figures come from.")


def row_tokens(spec: JobSpec, fmt: str | None, file_bytes: int, records: int) -> int:
    """Approximate tokens of one training row (prompt + completion, template included, capped
    at max_length). A preference record holds the prompt once and two completions: a row is
    about 2/3 of its bytes (prompt ≈ completion); other formats one completion."""
    if records <= 0:
        return spec.max_length
    per_record = file_bytes / records
    share = 2 / 3 if fmt in PAIRED_FORMATS else 1.0
    text = per_record * share / _per_model("bytes_per_token", spec.base_model)
    tokens = _per_model("template_tokens_per_row", spec.base_model) + text
    if spec.online is not None:  # a prompt file: the completion is sampled (upper bound)
        tokens = min(tokens, spec.max_prompt_length) + spec.online.max_new_tokens
    return max(1, min(spec.max_length, round(tokens)))


def _flops_per_token(spec: JobSpec, shape: ModelShape, checkpointing: bool, row: int) -> float:
    n = shape.params
    lora = spec.adapter.kind == "lora"
    attention = 12.0 * shape.num_layers * shape.hidden_size * row  # fwd + bwd, per token
    flops = (4 if lora else 6) * n + attention
    if spec.needs_reference:  # the reference / lookahead forward (SFT has none)
        flops += 2 * n + attention / 3
    if checkpointing:
        flops += 2 * n + attention / 3  # each layer's forward again in backward
    return flops


def estimate_job(
    spec: JobSpec,
    shape: ModelShape,
    *,
    file_format: str | None,
    file_bytes: int,
    records: int,
    device: str,
    processes: int,
    memory_bytes: int,
) -> JobEstimate:
    """The estimate of a resolved, admitted `spec` (see the module docstring). `memory_bytes`:
    what one process may use (the device's memory, at most the operator's cap)."""
    figures = throughput_table()["devices"][device]
    on_gpu = device != "cpu"
    examples = spec.examples_in(file_format or "", records)
    steps = spec.total_steps(examples)
    choice = choose_micro_batch(
        spec,
        shape,
        memory_bytes,
        world=processes,
        device="cuda" if on_gpu else "cpu",
        training_file_bytes=file_bytes,
        training_records=records,
    )
    row = row_tokens(spec, file_format, file_bytes, records)
    # rows scored a step: DPO 2 a pair, KTO 1 an example plus its mismatched KL row, GRPO G,
    # SFT 1 (JobSpec.rows_per_example: the rows with a graph)
    kl_rows = 1 if spec.objective.name == "kto" else 0
    rows_per_example = spec.rows_per_example + kl_rows
    rows_per_step = spec.examples_per_batch * rows_per_example
    tokens_per_step = rows_per_step * row
    tokens = tokens_per_step * steps
    per_token = _flops_per_token(spec, shape, choice.activation_checkpointing, row)
    if spec.objective.name == "kto":  # half the rows are KL rows: two forwards, no backward
        per_token -= ((4 if spec.adapter.kind == "lora" else 6) - 2) * shape.params / 2
    peak = figures["peak_flops"] * processes
    if spec.precision == "fp32":
        peak *= figures["fp32_peak_ratio"]
    train_flops = per_token * tokens
    # a step is compute-bound, or bound by its fixed cost (kernel launches, Python): the larger
    step_seconds = per_token * tokens_per_step / (peak * figures["hfu"])
    train_seconds = steps * max(step_seconds, figures["step_overhead_seconds"])
    sampled = 0
    sampling_seconds = 0.0
    if spec.online is not None:
        prompts = spec.examples_per_batch * steps  # one prompt per pair / group trained
        sampled = prompts * spec.online.num_samples * spec.online.max_new_tokens
        sample_flops = 2 * shape.params * sampled
        sampling_rate = figures["peak_flops"] * processes * figures["sampling_mfu"]
        sampling_seconds = sample_flops / sampling_rate
    startup = float(figures["startup_seconds"])
    tokenize = file_bytes / TOKENIZE_BYTES_PER_SECOND if spec.online is None else 0.0
    wall = startup + tokenize + train_seconds + sampling_seconds
    gpus = processes if on_gpu else 0
    return JobEstimate(
        device=device,
        processes=processes,
        gpus=gpus,
        memory_available_gib=round(memory_bytes / GiB, 3),
        micro_batch=choice.micro_examples,
        grad_accum=choice.grad_accum,
        activation_checkpointing=choice.activation_checkpointing,
        memory_gib_per_process=round(choice.estimate.gib, 3),
        memory_fits=choice.fits,
        steps=steps,
        examples=examples,
        tokens=tokens,
        tokens_per_step=tokens_per_step,
        tokens_method=(
            f"approximated: {row} tokens per row = the file's bytes per record "
            f"÷ {_per_model('bytes_per_token', spec.base_model):g} bytes per token "
            f"+ {_per_model('template_tokens_per_row', spec.base_model):g} template tokens, "
            f"capped at max_length {spec.max_length}; {rows_per_step} rows per step"
        ),
        sampled_tokens=sampled,
        train_flops=train_flops,
        train_seconds=round(train_seconds, 3),
        sampling_seconds=round(sampling_seconds, 3),
        tokenize_seconds=round(tokenize, 3),
        startup_seconds=startup,
        wall_clock_seconds=round(wall, 3),
        gpu_hours=round(wall * gpus / 3600, 6),
        sampling_share=round(sampling_seconds / wall, 4) if wall > 0 else 0.0,
        throughput_source=figures["source"],
    )
