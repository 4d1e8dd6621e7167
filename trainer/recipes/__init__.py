"""One recipe per objective; `make_recipe` is the one place the objective is dispatched."""

from __future__ import annotations

from trainer.recipes.base import LossContext, Recipe
from trainer.recipes.dpo import DPORecipe
from trainer.recipes.grpo import GRPORecipe
from trainer.recipes.kto import KTORecipe
from trainer.spec.job import JobSpec

_RECIPES = {"dpo": DPORecipe, "kto": KTORecipe, "grpo": GRPORecipe}


def make_recipe(spec: JobSpec) -> Recipe:
    return _RECIPES[spec.objective.name](spec)


__all__ = ["LossContext", "Recipe", "make_recipe"]
