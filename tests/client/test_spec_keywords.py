"""`client.jobs.create` takes every JobSpec field as a keyword, and its parameter shapes
(TypedDicts) name exactly the fields of the spec's nested models: held against
`JobSpec.model_json_schema()` (contract/spec.py), so a field added to the spec fails here
until the SDK has it. The SDK itself never imports the service's contract package."""

from __future__ import annotations

import inspect
import typing
from typing import Any

import pytest

from contract.spec import JobSpec
from humanline_client import AsyncClient, Client
from humanline_client._resource import REQUEST_OPTIONS
from humanline_client.resources.jobs import _Jobs

SCHEMA = JobSpec.model_json_schema()
DEFS = SCHEMA["$defs"]
SHORTHANDS = {"variant"}  # accepted by JobSpec before validation, not a field of it


def _typed_dicts(tp: Any) -> list[type]:
    """The TypedDicts an annotation mentions (through Optional, Union, list, ...)."""
    if typing.is_typeddict(tp):
        return [tp]
    return [td for arg in typing.get_args(tp) for td in _typed_dicts(arg)]


def _refs(node: Any) -> list[str]:
    """The $defs a schema node points to (through anyOf, oneOf, items, ...)."""
    if isinstance(node, dict):
        own = [node["$ref"].rsplit("/", 1)[-1]] if "$ref" in node else []
        return own + [r for key in ("anyOf", "oneOf", "items") for r in _refs(node.get(key))]
    if isinstance(node, list):
        return [r for item in node for r in _refs(item)]
    return []


def _check(path: str, tds: list[type], defs: list[str]) -> set[str]:
    """The TypedDicts `tds` name exactly the properties of the models `defs`, recursively;
    returns the models compared."""
    hints = {}
    for td in tds:
        hints.update(typing.get_type_hints(td))
    props = {}
    for name in defs:
        props.update(DEFS[name]["properties"])
    assert set(hints) == set(props), (path, sorted(set(hints) ^ set(props)))
    compared = set(defs)
    for key, node in props.items():
        nested = _refs(node)
        if nested:
            sub = _typed_dicts(hints[key])
            assert sub, f"{path}.{key}: the SDK types it without a TypedDict"
            compared |= _check(f"{path}.{key}", sub, nested)
    return compared


def _create_parameters() -> dict[str, inspect.Parameter]:
    params = dict(inspect.signature(_Jobs.create.steps).parameters)
    params.pop("self")
    return params


def test_create_keywords_are_the_spec_fields():
    params = _create_parameters()
    keywords = set(params) - set(REQUEST_OPTIONS)
    assert keywords - SHORTHANDS == set(SCHEMA["properties"])
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    required = {n for n, p in params.items() if p.default is inspect.Parameter.empty}
    assert required == set(SCHEMA["required"])
    JobSpec.model_validate(  # the shorthand is the spec's own
        {"base_model": "m", "training_file": "f", "objective": "dpo", "variant": "offline"}
    )


def test_nested_parameter_shapes_are_the_spec_models():
    hints = typing.get_type_hints(_Jobs.create.steps)
    compared: set[str] = set()
    for name, node in SCHEMA["properties"].items():
        defs = _refs(node)
        if defs:
            compared |= _check(name, _typed_dicts(hints[name]), defs)
    # objective, humanline_params, optim, adapter, online (+ rewards), evaluations
    # (+ judge, generation): every nested model of the spec was compared
    assert compared == set(DEFS)


@pytest.mark.parametrize("client_class", [Client, AsyncClient])
def test_both_clients_expose_the_keywords(client_class):
    client = client_class(api_key="hl_x")
    signature = inspect.signature(client.jobs.create)
    assert list(signature.parameters) == list(_create_parameters())
