"""TRL's `DPOTrainer` set up as the baseline our humanline DPO is timed against.

TRL's `SyncRefModelCallback` copies the policy into its reference every `ref_model_sync_steps`
with mixup α; one step and α = 1 is humanline syncing with k = 1 (without the clipping), the
closest TRL comes to our `offline+humanline` DPO. Shared by gpu_smoke.py (ours ÷ TRL on a GPU)
and sync_overhead.py (the same on this CPU), so both time the same configuration.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any


def trl_dpo_trainer(
    model_dir: Path,
    data: Path,
    out: Path,
    *,
    batch: int,
    steps: int,
    max_length: int,
    lr: float,
    cpu: bool,
    bf16: bool,
    callbacks: Iterable[Any] = (),
) -> Any:
    """A `DPOTrainer` on `data` (JSONL pairs) with fp32 master weights; `bf16` autocasts."""
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    from trainer.modeling import load_tokenizer

    args = DPOConfig(
        output_dir=str(out), per_device_train_batch_size=batch, max_steps=steps,
        max_length=max_length, learning_rate=lr,
        sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=1.0,
        report_to=[], save_strategy="no", logging_steps=10**6, disable_tqdm=True,
        use_cpu=cpu, dataloader_num_workers=0, bf16=bf16,
    )  # fmt: skip
    trainer = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        args=args,
        train_dataset=load_dataset("json", data_files=str(data), split="train"),
        processing_class=load_tokenizer(model_dir),
    )
    for callback in callbacks:  # added last: runs after TRL's own sync callback
        trainer.add_callback(callback)
    return trainer
