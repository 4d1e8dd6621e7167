"""Every store test runs against both backends: LocalStore and S3Store on a real SeaweedFS."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from storage import LocalStore, ObjectStore, S3Store


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest) -> ObjectStore:
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture
def raw_keys(request: pytest.FixtureRequest, store: ObjectStore) -> Callable[[], list[str]]:
    """Everything physically present in the backend, temporary objects included (a leak check
    must not go through `store.list`, which hides them)."""
    if isinstance(store, LocalStore):
        root = store.root

        def local() -> list[str]:
            out = []
            for dirpath, _, files in os.walk(root):
                out += [(Path(dirpath) / f).relative_to(root).as_posix() for f in files]
            return sorted(out)

        return local
    assert isinstance(store, S3Store)
    server = request.getfixturevalue("s3_server")
    return lambda: server.list_all(store.bucket)
