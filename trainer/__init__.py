"""Humanline trainer: SFT, and DPO/KTO/GRPO with their humanline variants, on the torch stack.

Imports the torch stack, contract/ (the spec, the data formats, the run-directory protocol)
and reports/ (statistics, the code version); the service never imports it: a worker starts
`python -m trainer run SPEC --out DIR` (and `python -m trainer.evaluation run`).

    train           the one training loop (accelerate): setup, resume, steps, checkpoints, export
    plan            the batch order, a pure function of the seed; rundata the run's examples
    memory          the memory a process has, the micro-batch it chooses, out-of-memory retries
    stepmetrics     a step's metrics to the host in one copy; stepwide what a step computes
                    over its whole batch, whatever the split (KTO's z0, humanline's M)
    reference       the reference log-probs: lookahead (humanline sync), a frozen model, or
                    none (SFT)
    losses/         one loss per objective; humanline clipping/sampling applied once
    recipes/        per objective: examples → rows → loss (`make_recipe` chooses)
    tokenize, logps chat rendering and collation; per-token log-probs
    sft_data        SFT conversations as one masked row; packed rows
    chunked_logps   log-probs from hidden states, a chunk of tokens at a time (no full logits)
    datastore       training examples' token ids, memory-mapped (files streamed, not held)
    online/         online rounds: sample, score, keep pairs/groups (paper, Algorithm 1);
                    async: a sampler process beside the trainer, lag steps behind
    sampling/       vLLM or transformers `generate` behind one interface
    rewards/        the registered reward sources (math-verify, format, a reward model, ...)
    modeling/       model sources, policy loading (full or LoRA), the exported model card
    distributed     DDP or FSDP2 behind one interface; dtensors the DTensor helpers it shares
    checkpoint      save/load every state a resume needs (DCP shards, committed by a marker);
                    checkpoint_v1 the format 1 loader; ckptio a checkpoint root, local or URL;
                    ckptstate what a checkpoint's plain files may hold, read safely
    process         a process's Accelerator, seeds and run result
    remote          a rank with no shared disk: spec and data from URLs, the run log mirrored
    runlog          the run directory's files
    quality         the data-quality score at step 0; seeds every random stream, derived once
    prompts, synthetic   small data sets the repo generates itself (demo, tests)
    evaluation/     instruction (pairwise judge) and math (pass@1) evaluations of a model
"""
