"""The training loop every objective and variant shares. Read top to bottom:
setup → reference → (resume) → steps [forward, loss, backward, clip, humanline sync, update,
log, checkpoint, stop?] → export.

Built on accelerate, so the same code runs in one CPU process, under
`accelerate launch --num_processes 2 --cpu` (DDP) and on GPUs.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from tqdm.auto import tqdm
from transformers import get_scheduler

from trainer import checkpoint
from trainer.logps import token_logps
from trainer.modeling import load_policy, load_tokenizer, resolve_model, save_pretrained_weights
from trainer.plan import BatchPlan, total_steps
from trainer.quality import data_quality, quality_batches
from trainer.recipes import LossContext, make_recipe
from trainer.reference import Lookahead, make_reference
from trainer.runlog import RunLog
from trainer.spec.data import read_jsonl
from trainer.spec.job import JobSpec
from trainer.tokenize import ChatTokenizer, collate


@dataclass
class RunResult:
    status: str  # "succeeded" | "stopped"
    step: int
    total_steps: int
    final_dir: str | None

    def as_dict(self) -> dict:
        return self.__dict__.copy()


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _sequences(example) -> list:
    return [example.seq] if hasattr(example, "seq") else list(example)


def train(spec: JobSpec, out_dir: Path, *, resume: bool = False, progress: bool = True) -> RunResult:
    # ---- setup -----------------------------------------------------------------------------
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    world, rank = accelerator.num_processes, accelerator.process_index
    log = RunLog(out_dir, enabled=accelerator.is_main_process)
    _seed_everything(spec.seed)

    model_dir = resolve_model(spec.base_model)
    tokenizer = load_tokenizer(model_dir)
    recipe = make_recipe(spec)
    fmt, records = read_jsonl(spec.training_file)
    if fmt not in recipe.accepts:
        raise ValueError(f"{spec.objective.name} trains on {' or '.join(recipe.accepts)} data, got {fmt}")
    chat = ChatTokenizer(tokenizer, spec.max_prompt_length, spec.max_length)
    examples = recipe.build(fmt, records, chat)
    log.event("data", f"{len(examples)} training examples from {len(records)} {fmt} records", **chat.report.as_dict())
    if chat.report.any:
        log.event("warning", "some examples were truncated or dropped to fit max_length", **chat.report.as_dict())
    steps = total_steps(len(examples), spec.global_batch_size, spec.epochs, spec.max_steps)
    plan = BatchPlan(len(examples), spec.global_batch_size, spec.grad_accum, world, rank, spec.seed, steps)
    pad_id = tokenizer.pad_token_id

    def batch_for(step: int, micro: int):
        return collate(recipe.rows(examples, plan.micro(step, micro), chat), pad_id)

    model = load_policy(spec, model_dir)
    params = [p for p in model.parameters() if p.requires_grad]
    o = spec.optim
    optimizer = torch.optim.AdamW(params, lr=spec.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
    scheduler = get_scheduler(o.schedule, optimizer, num_warmup_steps=int(o.warmup_ratio * steps), num_training_steps=steps)
    # The reference is taken before `prepare` and before any update: a frozen copy, if one
    # is needed at all, holds the initial weights.
    unwrapped = model
    model, optimizer = accelerator.prepare(model, optimizer)
    k = spec.humanline_params.sync_every
    reference = make_reference(
        spec.sync, model, unwrapped, spec.adapter.kind == "lora",
        batch_fn=batch_for, every=k, total=steps, accum=spec.grad_accum,
    )
    spec_json = spec.model_dump_json(indent=2)

    # ---- resume, or step 0 ------------------------------------------------------------------
    start = 0
    last = checkpoint.latest(out_dir) if resume else None
    if last is not None:
        checkpoint.load(last, accelerator=accelerator, model=model, optimizer=optimizer, scheduler=scheduler, reference=reference)
        start = last.step
        log.truncate_metrics(start)
        log.event("resumed", f"resumed from step {start}", step=start)
    else:
        if spec.quality_sample and accelerator.is_main_process:
            make = lambda idx: collate([s for i in idx for s in _sequences(examples[i])], pad_id)  # noqa: E731
            quality = data_quality(unwrapped, quality_batches(len(examples), make, spec.quality_sample))
            log.write_json("data_quality.json", quality)
            if quality.get("warning"):
                log.event("warning", quality["warning"], **{"data_quality_mean": quality["mean"]})
        accelerator.wait_for_everyone()
        if isinstance(reference, Lookahead):
            reference.refresh(0)  # steps 1..k use the initial weights as reference
    log.event("started", f"training {spec.variant} {spec.objective.name} for {steps} steps", total_steps=steps, world_size=world)

    # ---- train ------------------------------------------------------------------------------
    humanline = spec.humanline_params if spec.humanline else None
    sampled = humanline is not None and humanline.mode == "sample"
    bar = tqdm(total=steps, initial=start, disable=not (progress and accelerator.is_main_process), desc="train")
    status = "succeeded"
    step = start
    model.train()
    for step in range(start + 1, steps + 1):
        t0 = time.perf_counter()
        micro = [plan.micro(step, m) for m in range(spec.grad_accum)]
        batches = [batch_for(step, m) for m in range(spec.grad_accum)]
        ctx = LossContext(humanline=humanline, length_normalize=spec.length_normalize)
        if sampled:  # per-step stream: a resumed run draws the same Beta samples
            ctx.generator = torch.Generator(accelerator.device).manual_seed(spec.seed * 1_000_003 + step * 131 + rank)
        if recipe.token_level:  # DAPO: mean over every token of the global batch
            local = torch.tensor(float(sum(b.num_tokens for b in batches)), device=accelerator.device)
            ctx.token_normalizer = float(accelerator.reduce(local, "sum")) / (world * spec.grad_accum)
        if world > 1:
            ctx.kl_reduce = accelerator.gather
        sums: dict[str, float] = defaultdict(float)
        tokens = 0
        for m, (mb, batch) in enumerate(zip(micro, batches)):
            ref = reference.logps(step, m, batch)
            with accelerator.no_sync(model) if m < spec.grad_accum - 1 else nullcontext():
                pol = token_logps(model, batch)
                out = recipe.loss(pol, ref, batch, mb, examples, ctx)
                accelerator.backward(out.loss / spec.grad_accum)
            for name, value in out.metrics.items():
                sums[name] += value / spec.grad_accum
            tokens += int(batch.attention_mask.sum())
        grad_norm = accelerator.clip_grad_norm_(params, o.max_grad_norm)
        t_sync = time.perf_counter()
        if spec.sync == "humanline" and step % k == 0:
            reference.refresh(step)  # humanline: reference := θ_s, *before* the update
        t_sync = time.perf_counter() - t_sync
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if spec.sync == "trust_region" and step % k == 0:
            reference.refresh(step)  # trust region: reference := θ_{s+1}, after the update

        # ---- log, checkpoint, stop ------------------------------------------------------------
        keys = sorted(sums)
        reduced = accelerator.reduce(torch.tensor([sums[n] for n in keys], device=accelerator.device), "mean")
        metrics = dict(zip(keys, reduced.tolist()))
        elapsed = time.perf_counter() - t0
        metrics.update(grad_norm=float(grad_norm), lr=lr, step_time=elapsed, sync_time=t_sync,
                       tokens_per_s=tokens * world / elapsed)
        if step % spec.log_every == 0 or step == steps:
            log.metrics(step, metrics)
        bar.update(1)
        bar.set_postfix(loss=f"{metrics.get('loss', float('nan')):.4f}")
        stop = accelerator.reduce(torch.tensor(float(log.stop_requested()), device=accelerator.device), "sum") > 0
        due = spec.checkpoint_every and step % spec.checkpoint_every == 0
        if due or stop or step == steps:
            ck = checkpoint.save(out_dir, step, accelerator=accelerator, model=model, optimizer=optimizer,
                                 scheduler=scheduler, reference=reference, spec_json=spec_json, extra={"total_steps": steps})
            log.event("checkpoint", f"checkpoint at step {step}", step=step, path=str(ck.path))
        if stop and step < steps:
            status = "stopped"
            log.event("stopped", f"stopped at step {step} on request", step=step)
            break
    bar.close()

    # ---- export -----------------------------------------------------------------------------
    final_dir = None
    if status == "succeeded":
        if accelerator.is_main_process:
            final_dir = str(out_dir / "final")
            save_pretrained_weights(accelerator.unwrap_model(model), tokenizer, Path(final_dir))
        accelerator.wait_for_everyone()
        log.event("finished", f"finished {steps} steps", step=step)
    result = RunResult(status, step, steps, final_dir)
    log.write_json("result.json", result.as_dict())
    accelerator.end_training()
    return result
