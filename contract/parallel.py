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

Several nodes (issue 26; docs/deploy.md): `nodes` > 1 runs one job as a Kubeflow Trainer
TrainJob of `nodes` pods with `processes_per_node` processes each (required then: the world
size is `nodes * processes_per_node`). `processes_per_node` None keeps today's rule (metadata
`gpus`, else the worker's GPUs). `hsdp` (FSDP only, nodes > 1): shard within a node, replicate
across nodes (a 2-D mesh (nodes, processes_per_node), dims ("replicate", "shard")).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from contract.strict import StrictNumbers

Strategy = Literal["ddp", "fsdp"]


class ParallelConfig(StrictNumbers):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    strategy: Strategy = Field("ddp", description="'ddp' (replicate) or 'fsdp' (FSDP2, sharded).")
    reshard_after_forward: bool = Field(
        True, description="FSDP: re-gather weights for backward (least memory) or keep them."
    )
    nodes: int = Field(1, ge=1, description="Nodes (pods) the job spans; > 1: a TrainJob.")
    processes_per_node: int | None = Field(
        None,
        ge=1,
        description="Training processes per node; required when nodes > 1. None: metadata "
        "`gpus`, else the worker's GPUs.",
    )
    hsdp: bool = Field(
        False, description="FSDP across nodes: shard within a node, replicate across nodes."
    )

    @model_validator(mode="after")
    def _check_nodes(self) -> ParallelConfig:
        if self.nodes > 1 and self.processes_per_node is None:
            raise ValueError("processes_per_node is required when nodes > 1")
        return self

    @field_validator("hsdp")
    @classmethod
    def _hsdp_fits(cls, hsdp: bool, info: ValidationInfo) -> bool:
        """A field's check (the last field: the others are validated), so errors name it."""
        if hsdp and info.data.get("strategy", "fsdp") != "fsdp":
            raise ValueError("hsdp needs strategy 'fsdp'")
        if hsdp and info.data.get("nodes", 2) == 1:
            raise ValueError("hsdp needs nodes > 1 (it replicates across nodes)")
        return hsdp

    @property
    def fsdp(self) -> bool:
        return self.strategy == "fsdp"

    @property
    def multinode(self) -> bool:
        return self.nodes > 1

    def world_size(self, default_per_node: int = 1) -> int:
        """Processes in all: nodes * processes_per_node, `default_per_node` standing in for
        an unset processes_per_node (the worker's GPUs or metadata `gpus`)."""
        per_node = self.processes_per_node or max(1, default_per_node)
        return self.nodes * per_node


def _fits_job(value: ParallelConfig, info: ValidationInfo) -> ParallelConfig:
    """Checks against the fields validated before it (`parallelism` is JobSpec's last field)."""
    if value.fsdp and info.data.get("precision") == "fp16":
        raise ValueError(
            "strategy 'fsdp' trains in fp32 or bf16; fp16 needs a gradient scaler "
            "it does not have (use precision 'bf16')"
        )
    return value


Parallelism = Annotated[ParallelConfig, AfterValidator(_fits_job)]
