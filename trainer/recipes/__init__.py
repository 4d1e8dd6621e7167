"""One recipe per objective; `make_recipe` is the one place the objective is dispatched."""

from __future__ import annotations

from collections.abc import Callable

from contract.spec import JobSpec
from trainer.recipes.base import LossContext, Recipe
from trainer.recipes.dpo import DPORecipe
from trainer.recipes.grpo import GRPORecipe
from trainer.recipes.kto import KTORecipe
from trainer.recipes.sft import SFTRecipe

# Each class is checked against the Recipe protocol here.
_RECIPES: dict[str, Callable[[JobSpec], Recipe]] = {
    "sft": SFTRecipe,
    "dpo": DPORecipe,
    "kto": KTORecipe,
    "grpo": GRPORecipe,
}


def make_recipe(spec: JobSpec) -> Recipe:
    return _RECIPES[spec.objective.name](spec)


__all__ = ["LossContext", "Recipe", "make_recipe"]
