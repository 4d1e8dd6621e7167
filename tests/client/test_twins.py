"""Client and AsyncClient stay in step: each resource method is written once (as steps,
humanline_client/_steps.py) and bound to both twins, so every public method exists on both
with the same signature and docstring; only the awaiting differs."""

from __future__ import annotations

import inspect

import pytest

from humanline_client import AsyncClient, AsyncJobEventStream, Client, JobEventStream
from humanline_client._methods import endpoint, paged, twin

RESOURCES = ["files", "jobs", "evaluations", "reports"]
# Methods that are not awaited on AsyncClient: lazy listings and the event stream.
NOT_AWAITED = {"list", "events", "metrics", "checkpoints", "stream_events"}


def _public(obj: object) -> dict[str, object]:
    return {
        name: getattr(obj, name)
        for name in dir(obj)
        if not name.startswith("_") and callable(getattr(obj, name))
    }


@pytest.fixture
def twins():
    sync, aio = Client(api_key="hl_x"), AsyncClient(api_key="hl_x")
    yield sync, aio
    sync.close()


def test_clients_have_the_same_resources_and_options(twins):
    sync, aio = twins
    for name in RESOURCES:
        assert type(getattr(aio, name)).__name__ == "Async" + type(getattr(sync, name)).__name__
    assert set(_public(sync)) - {"close"} == set(_public(aio)) - {"close"}
    copy = aio.with_options(timeout=5, default_headers={"X-A": "1"})
    assert isinstance(copy, AsyncClient) and copy._http is aio._http
    assert copy.default_headers == {"X-A": "1"} and copy.jobs._client is copy


@pytest.mark.parametrize("resource", RESOURCES)
def test_resource_methods_are_twins(twins, resource):
    sync, aio = (getattr(c, resource) for c in twins)
    methods, amethods = _public(sync), _public(aio)
    assert set(methods) == set(amethods), resource
    for name, method in methods.items():
        amethod = amethods[name]
        where = f"{resource}.{name}"
        signature, asignature = inspect.signature(method), inspect.signature(amethod)
        assert signature.parameters == asignature.parameters, where
        returns = str(signature.return_annotation)
        assert str(asignature.return_annotation) in (
            returns,
            "Async" + returns,
            returns.replace("Sync", "Async"),
        ), where
        assert "self" not in inspect.signature(method).parameters, where
        assert inspect.iscoroutinefunction(amethod) == (name not in NOT_AWAITED), where
        assert not inspect.iscoroutinefunction(method), where
        shared = getattr(type(sync), name, None)
        if isinstance(inspect.getattr_static(type(sync), name), (endpoint, paged, twin)):
            assert method.__doc__ == amethod.__doc__, where  # one definition
        else:  # written twice (stream_events): the async one points to the sync one
            assert shared is not None and amethod.__doc__, where


def test_streams_are_twins():
    sync = {n for n in dir(JobEventStream) if not n.startswith("_")}
    aio = {n for n in dir(AsyncJobEventStream) if not n.startswith("_")}
    assert sync - {"close"} == aio - {"aclose"} == {"job_id", "status", "last_seq", "reconnects"}
