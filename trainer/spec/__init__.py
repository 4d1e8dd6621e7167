"""Torch-free part of the trainer: the job spec and the dataset formats (the API imports it)."""

from trainer.spec.job import (
    AdapterConfig,
    DPOConfig,
    GRPOConfig,
    HumanlineParams,
    JobSpec,
    KTOConfig,
    OptimConfig,
)

__all__ = [
    "AdapterConfig",
    "DPOConfig",
    "GRPOConfig",
    "HumanlineParams",
    "JobSpec",
    "KTOConfig",
    "OptimConfig",
]
