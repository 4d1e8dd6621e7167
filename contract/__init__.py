"""The contract between the processes: what the API, the worker and the trainer agree on.

Torch-free (the API imports it); each decision below is made here, once.

    spec        JobSpec, the job spec every process validates with (resolved defaults);
                sft_spec the SFT objective's config, humanline_params humanline's section,
                strict what every spec model refuses (Infinity/NaN, booleans for integers)
    presets     the paper's two testbeds (instruction, math) as bundles of defaults
    parallel    `parallelism`: DDP or FSDP2 for a multi-process job
    sync        SyncPolicy: when the reference model moves
    online_async  online.mode/lag: the async sampler's fixed-lag schedule and its refusals
    vllm        an online job's vLLM settings
    rewards     the reward sources a job may name (the code: trainer.rewards)
    graders     OpenAI's grader templates ({{item.x}}, {{sample.output_text}}) and string_check
    items       OpenAI's reinforcement lines (messages + the item's fields) and which lines
                hold which fields (profiled at upload)
    evaluation  what an evaluation request names (file, kind, judge, generation)
    data        the training-file formats and the one JSONL validator (BOM handling included);
                sft_data the SFT formats (prompt/completion, OpenAI's chat messages),
                records the field checks every format's parser shares
    runs        the run-directory protocol between worker and trainer: file names, STOP,
                exit codes, event kinds
    tasks       Celery task and queue names (the API sends by name, the worker registers)
    memory      a job's peak training memory per process, estimated from the spec (caps),
                calibrated (memory_calibration.json)
    micro_batch the micro-batch (grad_accum, checkpointing) that fits a given memory
    shapes      the model sizes memory depends on, and the built-in models' shapes
    estimate    a job's cost before launch: steps, tokens, memory, GPUs, wall-clock, GPU-hours
                (throughput.json: the throughput table the GPU proof calibrates)
"""

from contract.spec import (
    AdapterConfig,
    DPOConfig,
    GRPOConfig,
    HumanlineParams,
    JobSpec,
    KTOConfig,
    OptimConfig,
    SFTConfig,
)

__all__ = [
    "AdapterConfig",
    "DPOConfig",
    "GRPOConfig",
    "HumanlineParams",
    "JobSpec",
    "KTOConfig",
    "OptimConfig",
    "SFTConfig",
]
