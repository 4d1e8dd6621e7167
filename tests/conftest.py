"""Root conftest: shared fixture modules and the GPU skip."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytest_plugins = ["tests.fixtures.db", "tests.fixtures.s3", "tests.fixtures.services"]


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_dtensor_cache_left():
    """A test that ran DTensor ops in this (main) thread leaves no sharding cache behind: its
    entries keep a gloo process group alive, and a later worker test that forks from a thread
    (Popen with a preexec_fn) would free it in the child and crash there
    (trainer.distributed.release_sharding_cache)."""
    yield
    import sys

    if "torch" in sys.modules:
        from trainer.distributed import release_sharding_cache

        release_sharding_cache()
