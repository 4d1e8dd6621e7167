"""How a multi-process job spreads over its processes: the spec's `parallelism` field.

Torch-free (the API validates with it). Two strategies, both on the same launcher
(`accelerate launch --num_processes N`, built by the worker; one process needs none):

* `ddp` (default): every process holds the whole model and optimizer; gradients are averaged
  (torch DistributedDataParallel, through accelerate). One process: a plain run.
* `fsdp`: FSDP2 (`torch.distributed.fsdp.fully_shard`): each decoder layer and the root are
  sharded over the processes, so weights, gradients and AdamW state take 1/N of the memory per
  process; the result equals DDP's (same global batch, same data order). Works with full
  fine-tuning and LoRA, with every reference strategy (humanline syncing included), on GPUs
  (NCCL) and CPUs (gloo), and with one process (the FSDP code path on one device).
  Offline and online data: each online round gathers the policy's weights whole, one tensor
  at a time, into every rank's sampler (trainer.sampling.gathered), whose decoding is then
  local. fp32 or bf16.

`reshard_after_forward` (FSDP only): free the gathered weights after each layer's forward and
gather them again for backward (ZeRO-3, least memory, the default) or keep them until backward
(ZeRO-2: one all-gather per layer and step fewer, the whole model's weights held per step).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo

Strategy = Literal["ddp", "fsdp"]


class ParallelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    strategy: Strategy = Field("ddp", description="'ddp' (replicate) or 'fsdp' (FSDP2, sharded).")
    reshard_after_forward: bool = Field(
        True, description="FSDP: re-gather weights for backward (least memory) or keep them."
    )

    @property
    def fsdp(self) -> bool:
        return self.strategy == "fsdp"


def _fits_job(value: ParallelConfig, info: ValidationInfo) -> ParallelConfig:
    """Checks against the fields validated before it (`parallelism` is JobSpec's last field)."""
    if value.fsdp and info.data.get("precision") == "fp16":
        raise ValueError(
            "strategy 'fsdp' trains in fp32 or bf16; fp16 needs a gradient scaler "
            "it does not have (use precision 'bf16')"
        )
    return value


Parallelism = Annotated[ParallelConfig, AfterValidator(_fits_job)]
