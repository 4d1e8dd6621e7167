"""The training loop every objective and variant shares. Read top to bottom:
setup (`Trainer.__init__`) → resume or step 0 → steps (`Trainer.step`: forward, loss, backward,
clip, humanline sync, update) with logging, checkpoints and stop requests (`Trainer.run`) →
export.

Built on accelerate, so the same code runs in one CPU process, under
`accelerate launch --num_processes 2 --cpu` (DDP, or FSDP2 when `spec.parallelism` says so:
trainer.distributed) and on GPUs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import get_scheduler

from contract.memory import GiB
from contract.runs import (
    CHECKPOINT_EVENT,
    CHECKPOINT_STATE_FILE,
    DATA_QUALITY_FILE,
    FINAL_DIR,
    RESULT_FILE,
)
from contract.spec import JobSpec
from reports.version import code_version
from trainer import checkpoint
from trainer.distributed import make_parallel
from trainer.logps import batch_logps, keep_softmax
from trainer.memory import after_out_of_memory, choose_micro_batch_here, forget_gradients
from trainer.modeling import (
    activation_checkpointing,
    apply_model_options,
    load_policy,
    load_tokenizer,
    resolve_model,
)
from trainer.modeling.card import finish_export
from trainer.online.async_data import AsyncOnlineData
from trainer.online.rounds import OnlineData
from trainer.process import RunResult, make_accelerator, seed_everything
from trainer.quality import data_quality, quality_batches
from trainer.recipes import LossContext, make_recipe
from trainer.reference import Lookahead, make_reference
from trainer.rundata import load_data
from trainer.runlog import ProgressEvents, RunLog
from trainer.seeds import derive_seed
from trainer.stepmetrics import STOP, reduce_step_metrics
from trainer.stepwide import step_inputs
from trainer.tokenize import ChatTokenizer, TokenBatch

# Micro-batches of rows the lookahead reference scores in one no-grad forward.
LOOKAHEAD_MICRO_BATCHES = 2


class Trainer:
    def __init__(
        self,
        spec: JobSpec,
        out_dir: Path,
        *,
        resume: bool = False,
        progress: bool = True,
        checkpoints: str | Path | None = None,
        final: str | None = None,
    ):
        # ---- setup -------------------------------------------------------------------------
        self.spec, self.progress = spec, progress
        self.out_dir = Path(out_dir)
        # the checkpoint root: OUT/checkpoints, or a directory or fsspec URL shared by the ranks
        self.checkpoints = checkpoints or checkpoint.checkpoint_dir(self.out_dir)
        self.final = final  # an fsspec URL the export is published to (committed), if any
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # fp32 master weights; the forward autocasts to bf16 (GPU or CPU) or fp16 (GPU only;
        # CPUs have no fast fp16 kernels) as the spec asks (see load_policy)
        on_gpu = torch.cuda.is_available()
        mixed = (
            spec.precision
            if spec.precision == "bf16" or (on_gpu and spec.precision == "fp16")
            else "no"
        )
        self.accelerator = acc = make_accelerator(on_gpu, mixed)
        self.log = RunLog(self.out_dir, enabled=acc.is_main_process)
        if spec.precision == "fp16" and not on_gpu:
            self.log.event("warning", "precision fp16 needs a GPU; training in fp32 on the CPU")
        seed_everything(spec.seed)

        self.log.event("progress", "loading the model", phase="loading_model")
        self.model_dir = resolve_model(spec.base_model)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.recipe = make_recipe(spec)
        self.chat = ChatTokenizer(self.tokenizer, spec.max_prompt_length, spec.max_length)
        self.data, self.total = load_data(
            spec, self.recipe, self.chat, acc, self.out_dir, self.log, self.model_dir
        )

        # Rows per forward: chosen from the estimate and the memory this process has, unless
        # the spec sets grad_accum (contract.micro_batch.choose_micro_batch); before the model is
        # loaded, so a GPU's free memory is the whole budget.
        self.memory, self.room = choose_micro_batch_here(
            spec, acc, self.model_dir, self.out_dir, resume
        )
        if not self.memory.fits:
            self.log.event("warning", f"the job may not fit in memory: {self.memory.reason}")
        self.data.set_accum(self.memory.grad_accum)
        self.compile = spec.compiles_on(acc.device.type)

        model = load_policy(spec, self.model_dir)

        # per-layer recompute in backward and regional compile; a compile that fails (now or
        # at a first forward) falls back to eager with a warning event, never a failed job
        def warn(message: str) -> None:
            self.log.event("warning", message)

        for message in apply_model_options(
            model,
            checkpointing=self.memory.activation_checkpointing,
            compile=self.compile,
            warn=warn,
        ):
            warn(message)
        keep_softmax(model, self.memory.keep_softmax)  # the head's backward: keep or recompute
        # DDP (accelerate) or FSDP2 (sharded in place, so the optimizer is made afterwards)
        self.parallel = make_parallel(spec.parallelism, acc)
        self.unwrapped = model
        self.model = self.parallel.wrap(model)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        o = spec.optim
        optimizer = torch.optim.AdamW(
            self.params,
            lr=spec.lr,
            betas=o.betas,
            eps=o.eps,
            weight_decay=o.weight_decay,
            fused=True,
        )  # one kernel per step: 4x faster than foreach on CPU
        # warm-up then constant by default, as the authors' code runs (contract.spec.OptimConfig)
        self.scheduler = get_scheduler(
            o.schedule,
            optimizer,
            num_warmup_steps=int(o.warmup_ratio * self.total),
            num_training_steps=self.total,
        )
        self.optimizer = self.parallel.wrap_optimizer(optimizer)
        # The reference is made before any update: a frozen copy, if one is needed at all,
        # holds the initial weights.
        self.sync = spec.sync_policy  # every sync decision below asks this (contract.sync)
        self.reference = make_reference(
            spec.needs_reference,
            self.sync,
            self.model,
            model,
            spec.adapter.kind == "lora",
            spec.logps_temperature,
            copy_model=self.parallel.frozen_copy,
            batch_fn=self.batch_for,
            micro_count=lambda: self.data.accum,
            collate_fn=self._collate,
            # a no-grad forward keeps no activations for backward: two micro-batches' rows at a
            # time hold less than one training micro-batch does
            max_rows=lambda: LOOKAHEAD_MICRO_BATCHES * self.memory_rows(),
        )
        self.humanline = spec.humanline_params if spec.humanline else None
        self.reference_version = 0  # the policy version the reference holds (0: unknown)
        self._batches: dict[tuple[int, int], TokenBatch] = {}
        # One pass per shared prompt (trainer.tokenize.SharedPrefix) on the CPU, none on a GPU;
        # under FSDP every batch takes the same layout, so all ranks run the same forwards.
        self.share_prompts = self.parallel.share_prompts

        # ---- resume, or step 0 ----------------------------------------------------------------
        self.start = 0
        last = checkpoint.latest(self.checkpoints) if resume else None
        if last is not None:
            state = checkpoint.read_json(last.path, CHECKPOINT_STATE_FILE)
            checkpoint.check_position(state, last.step, spec.examples_per_batch)
            # the split the checkpoint's pending reference rows were read with (before rows were
            # keyed, trainer.reference.Lookahead); the run goes on with this run's own choice
            self.data.set_accum(state.get("grad_accum") or spec.grad_accum or 1)
            checkpoint.load(last, **self._state())
            self.data.set_accum(self.memory.grad_accum)
            self.start = last.step
            self.log.truncate_metrics(self.start)
            self.log.event("resumed", f"resumed from step {self.start}", step=self.start)
        else:
            # scored on rank 0; on every rank when forwards are collective (FSDP)
            if (
                spec.quality_sample
                and spec.data_source == "offline"
                and (acc.is_main_process or self.parallel.collective_forward)
            ):
                self.log.event("progress", "scoring the data's quality", phase="scoring_data")
                self._data_quality()
            acc.wait_for_everyone()
            if self.sync.moves and spec.data_source == "offline":
                self._refresh_reference(0)  # steps 1..k use the initial weights as reference
        self.model.train()

    def _refresh_reference(self, step: int) -> None:
        """Current weights → reference of steps step+1 .. the next sync point, within the
        current data segment (the run offline; the round online)."""
        end = self.data.segment_end(step + 1)
        if end <= step:
            return  # the next step opens a new round, whose start resets the reference
        with self.accelerator.autocast():  # the reference sees the same precision as the policy
            self.reference.refresh(step, self.sync.reach(step, end))
        self.reference_version = self.scheduler.last_epoch + 1  # the weights' (online_async)

    def _begin_round(self, step: int) -> dict[str, float]:
        """Online: sample the round that starts at `step`; its reference is the policy now."""
        data = self.data
        assert isinstance(data, OnlineData)  # only online data asks for rounds (needs_round)
        stats = data.begin_round(step, self.unwrapped, self.model_dir, self.tokenizer)
        # The sampler as it started (engine, vLLM executor): on the round that started it.
        sampler, data.sampler_started = data.sampler_started, {}
        self.log.event(
            "round",
            f"round {int(stats['round/index'])}: {int(stats['round/examples'])} examples "
            f"from {int(stats['round/prompts'])} prompts",
            step=step,
            **stats,
            **({"sampler": sampler} if sampler else {}),
        )
        if isinstance(data, AsyncOnlineData) and not self.sync.periodic:
            # plain online: the round's reference is the policy that sampled it, as scored by
            # the sampler (GRPO's π_old), never recomputed with the newer weights trained now
            assert isinstance(self.reference, Lookahead)  # every online reference looks ahead
            self.reference.install(step, data.round_rows(self.batch_for), data.behaviour())
            self.reference_version = data.round.version if data.round else 0
        else:
            self._refresh_reference(step - 1)
        return stats

    def batch_for(self, step: int, micro: int) -> TokenBatch:
        """This process's micro-batch `micro` of `step`: a pure function of the plan.

        Kept until its step has run, so a batch the lookahead reference scored early is not
        collated twice.
        """
        key = (step, micro)
        if key not in self._batches:
            mb = self.data.micro(step, micro)
            rows = self.recipe.rows(self.data.examples, mb, self.chat)
            batch = self._collate(rows)
            aux = self.recipe.no_grad_rows(self.data.examples, mb, self.chat)
            if aux:
                batch.aux = self._collate(aux)
            self._batches[key] = batch
        return self._batches[key]

    def _data_quality(self) -> None:
        examples = self.data.examples

        def make(idx):
            return self._collate([s for i in idx for s in self.recipe.sequences(examples[i])])

        seed = derive_seed(self.spec.seed, "quality")
        quality = data_quality(
            self.unwrapped, quality_batches(len(examples), make, self.spec.quality_sample, seed)
        )
        self.log.write_json(DATA_QUALITY_FILE, quality)
        if quality.get("warning"):
            self.log.event("warning", quality["warning"], data_quality_mean=quality["mean"])

    # ---- the micro-batch ------------------------------------------------------------------------
    def memory_rows(self) -> int:
        """Rows of one training micro-batch (the lookahead scores a few of these at a time)."""
        # KTO: its mismatched rows too; SFT: one row an example (group_size 1)
        per_example = 2 if self.spec.objective.name in ("dpo", "kto") else self.spec.group_size
        return self.memory.micro_examples * per_example

    def _collate(self, rows: list) -> TokenBatch:
        return self.recipe.collate(rows, self.tokenizer.pad_token_id, self.share_prompts)

    def _out_of_memory(self, step: int, error: BaseException) -> None:
        """An out-of-memory error in `step`: free what the attempt held, then split the batch
        finer and let the caller redo the step (one process), or stop for a retry from the
        last checkpoint (trainer.memory.after_out_of_memory)."""
        forget_gradients(self.model, self.optimizer)  # FSDP2's unsharded buffers too
        self._batches.clear()  # collated for the old split
        self.memory = after_out_of_memory(
            self.spec, self.accelerator, self.memory, step, error, self.log, self.out_dir
        )
        self.data.set_accum(self.memory.grad_accum)
        keep_softmax(self.unwrapped, self.memory.keep_softmax)

    # ---- one optimizer step ---------------------------------------------------------------------
    def step(self, step: int) -> dict[str, float]:
        acc = self.accelerator
        t0 = time.perf_counter()
        round_stats = self._begin_round(step) if self.data.needs_round(step) else {}
        reference_version = self.reference_version  # the one this step uses
        while True:
            try:
                metrics, tokens, t_sync = self._update(step)
                break
            except torch.OutOfMemoryError as error:
                self._out_of_memory(step, error)  # one process: halved, redo the step
        if isinstance(self.data, AsyncOnlineData):  # version step + 1 to the sampler
            round_stats = round_stats | self.data.after_step(step, self.unwrapped)
        elapsed = time.perf_counter() - t0
        metrics.update(
            step_time=elapsed,
            sync_time=t_sync,
            tokens_per_s=tokens * acc.num_processes / elapsed,
            **round_stats,
        )
        if isinstance(self.data, AsyncOnlineData):
            metrics.update(self.data.shares(round_stats, elapsed))
            metrics["async/reference_version"] = float(reference_version)
        return metrics

    def _update(self, step: int) -> tuple[dict[str, float], int, float]:
        """Forward, loss and backward of every micro-batch, clipping, the humanline sync and the
        update: (metrics, this process's tokens, seconds spent syncing). The device is waited
        for once, for the metrics at the end (one host copy of every figure)."""
        spec, acc = self.spec, self.accelerator
        accum, world = self.data.accum, acc.num_processes
        micro = [self.data.micro(step, m) for m in range(accum)]
        batches = [self.batch_for(step, m) for m in range(accum)]
        ctx = LossContext(humanline=self.humanline, length_normalize=spec.length_normalize)
        if isinstance(self.data, AsyncOnlineData) and self.data.cfg.is_cap is not None:
            ctx.behaviour, ctx.is_cap = self.data.behaviour(), self.data.cfg.is_cap
        if self.humanline is not None and self.humanline.mode == "sample":
            # a per-step stream, so a resumed run draws the same Beta samples
            seed = derive_seed(spec.seed, "humanline", step, acc.process_index)
            ctx.generator = torch.Generator(acc.device).manual_seed(seed)
        if self.recipe.token_level:  # DAPO: mean over every token of the global batch
            local_tokens = float(sum(b.num_tokens for b in batches))  # host tensors: no sync
            if world > 1:
                total = acc.reduce(torch.tensor(local_tokens, device=acc.device), "sum")
                ctx.token_normalizer = total / (world * accum)  # stays on the device
            else:
                ctx.token_normalizer = local_tokens / accum
        if world > 1:
            ctx.kl_reduce = acc.gather
        sums: dict[str, torch.Tensor] = {}
        tokens = 0
        # One autocast region for the step: a weight is cast to the compute precision once per
        # step (autocast caches the casts of leaf weights until the region ends), not per forward.
        with acc.autocast():
            inputs = step_inputs(self, step, micro, batches, ctx)  # refs; z0 and M: whole step
            for m, (mb, batch, scored, ref) in enumerate(inputs):
                with self.parallel.accumulate(self.model, sync=m == accum - 1):
                    pol = batch_logps(self.model, scored, spec.logps_temperature)
                    out = self.recipe.loss(pol, ref, scored, mb, self.data.examples, ctx)
                    acc.backward(out.loss / accum)
                for name, value in out.metrics.items():
                    sums[name] = sums.get(name, 0.0) + value / accum
                tokens += batch.seq_tokens
        grad_norm = self.parallel.clip_grad_norm_(self.params, spec.optim.max_grad_norm)
        t_sync = time.perf_counter()
        if self.sync.before_update(step):
            self._refresh_reference(step)  # humanline: reference := θ_s, *before* the update
        t_sync = time.perf_counter() - t_sync
        lr = self.optimizer.param_groups[0]["lr"]  # the rate this update uses
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._batches = {key: b for key, b in self._batches.items() if key[0] > step}  # used now
        if self.sync.after_update(step):
            self._refresh_reference(step)  # trust region: reference := θ_{s+1}, after the update
        stop = self.log.stop_requested()
        return reduce_step_metrics(acc, sums, grad_norm, stop) | {"lr": lr}, tokens, t_sync

    # ---- the run: steps, logging, checkpoints, stop requests, export ----------------------------
    def run(self) -> RunResult:
        spec, acc, log = self.spec, self.accelerator, self.log
        # the resolved values, never "default": what this run actually uses (JobSpec.summary)
        resolved = spec.summary(self.total)
        message = (
            f"training {spec.variant} {spec.objective.name} for {self.total} steps: "
            + ", ".join(f"{k} {v}" for k, v in resolved.items() if v is not None)
        )
        choice = self.memory
        log.event(
            "started",
            message,
            world_size=acc.num_processes,
            device=acc.device.type,
            **resolved,
            grad_accum=self.data.accum,
            micro_batch=choice.micro_examples,
            activation_checkpointing=activation_checkpointing(self.unwrapped),  # as applied
            compile=self.compile,
            logps_keep_softmax=choice.keep_softmax,
            memory_available_gib=round(self.room / GiB, 2),
            memory_estimate_gib=round(choice.estimate.gib, 2),
        )
        if acc.is_main_process:
            print(message, file=sys.stderr, flush=True)
        bar = tqdm(
            total=self.total,
            initial=self.start,
            desc="train",
            disable=not (self.progress and acc.is_main_process),
        )
        status, step, metrics = "succeeded", self.start, {}
        progress = ProgressEvents(log, self.start, self.total)
        try:  # the data holds processes (the async sampler): never left behind on an error
            for step in range(self.start + 1, self.total + 1):
                metrics = self.step(step)
                # every process must agree on stopping, or the collectives below would hang: the
                # ranks that saw a STOP file were counted with the step's metrics (one transfer)
                stop = metrics.pop(STOP) > 0
                if step % spec.log_every == 0 or step == self.total:
                    log.metrics(step, metrics)
                progress.after(step, metrics.get("loss"))
                bar.update(1)
                bar.set_postfix(loss=f"{metrics.get('loss', float('nan')):.4f}")
                due = spec.checkpoint_every and step % spec.checkpoint_every == 0
                if due or stop or step == self.total:
                    self.save(step)
                if stop and step < self.total:
                    status = "stopped"
                    log.event("stopped", f"stopped at step {step} on request", step=step)
                    break
        except BaseException:
            self.data.close()
            raise
        bar.close()
        self.data.close()

        final_dir = None
        if status == "succeeded":
            final_dir = str(self.out_dir / FINAL_DIR)
            self.parallel.export(self.model, self.tokenizer, Path(final_dir))  # rank 0 writes
            if acc.is_main_process:  # public base name and a model card (trainer.modeling.card)
                finish_export(
                    Path(final_dir), spec, steps=step, metrics=metrics, code_version=code_version()
                )
            if self.final is not None:  # each node's share of the export, then the marker
                checkpoint.publish(Path(final_dir), self.final, acc)
                final_dir = self.final
            final_dir = final_dir if acc.is_main_process else None
            acc.wait_for_everyone()
            log.event("finished", f"finished {self.total} steps", step=step)
        result = RunResult(status, step, self.total, final_dir)
        log.write_json(RESULT_FILE, result.as_dict())
        acc.end_training()
        self.parallel.close()
        return result

    def _state(self) -> dict[str, Any]:
        """What a checkpoint holds and a resume restores: the same objects both ways."""
        return dict(
            accelerator=self.accelerator,
            parallel=self.parallel,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            reference=self.reference,
            data=self.data,
        )

    def save(self, step: int) -> None:
        ck = checkpoint.save(
            self.checkpoints,
            step,
            **self._state(),
            spec_json=self.spec.model_dump_json(indent=2),
            extra={
                "total_steps": self.total,
                "grad_accum": self.data.accum,
                "global_sample": checkpoint.global_sample(step, self.spec.examples_per_batch),
            },
        )
        self.log.event(CHECKPOINT_EVENT, f"checkpoint at step {step}", step=step, path=str(ck.path))


def train(
    spec: JobSpec,
    out_dir: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    checkpoints: str | Path | None = None,
    final: str | None = None,
) -> RunResult:
    """Run a spec to completion (or to a stop request) in `out_dir`; checkpoints under
    `checkpoints` (a directory or an fsspec URL; default `out_dir/checkpoints`); the export in
    `out_dir/final`, published to `final` (an fsspec URL) when given."""
    trainer = Trainer(
        spec, out_dir, resume=resume, progress=progress, checkpoints=checkpoints, final=final
    )
    return trainer.run()
