"""What every spec model refuses beyond its fields' own bounds (issue 37): non-finite floats
(`Infinity`, `NaN`: JSON has no such numbers, and the database stores them as null, so a job
would be created and fail at launch) and booleans where an integer is expected
(`parallelism.nodes: true` is not 1). Models inherit `StrictNumbers`; the error names the
leaf field, as pydantic's location does."""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError


def _takes_int_not_bool(annotation: Any) -> bool:
    """Does the annotation accept an int but not a bool (`int`, `int | None`, Annotated)?"""
    seen: set[Any] = set()

    def walk(a: Any) -> None:
        if get_origin(a) is Annotated:
            walk(get_args(a)[0])
        elif get_origin(a) in (Union, types.UnionType):
            for arg in get_args(a):
                walk(arg)
        else:
            seen.add(a)

    walk(annotation)
    return int in seen and bool not in seen


class StrictNumbers(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_int(cls, data: Any) -> Any:
        # A model-level check (a field validator on "*" would clash with discriminators);
        # its errors carry each field's own location.
        if not isinstance(data, dict):
            return data
        errors = [
            InitErrorDetails(
                type=PydanticCustomError("int_type", "Input should be an integer, not a boolean"),
                loc=(name,),
                input=value,
            )
            for name, value in data.items()
            if isinstance(value, bool)
            and name in cls.model_fields
            and _takes_int_not_bool(cls.model_fields[name].annotation)
        ]
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return data
