"""Trainer fixtures: a shared model cache and small generated datasets."""

from pathlib import Path

import pytest

from trainer.spec.job import JobSpec
from trainer.synthetic import preference_records, unpaired_records, write_jsonl


@pytest.fixture(scope="session", autouse=True)
def _model_cache(tmp_path_factory):
    """One cache per test session (the CI clone starts empty; a dev's cache is reused)."""
    import os

    if "HUMANLINE_CACHE" not in os.environ:
        os.environ["HUMANLINE_CACHE"] = str(Path.home() / ".cache" / "humanline")
    yield


@pytest.fixture(scope="session")
def pref_file(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("data") / "pref.jsonl", preference_records(64, seed=1))


@pytest.fixture(scope="session")
def unpaired_file(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("data") / "unpaired.jsonl", unpaired_records(64, seed=2))


@pytest.fixture
def make_spec(pref_file):
    def make(**kw) -> JobSpec:
        base = {
            "base_model": "tiny-llama",
            "training_file": str(pref_file),
            "objective": "dpo",
            "batch_size": 4,
            "max_steps": 6,
            "max_length": 96,
            "max_prompt_length": 48,
            "optim": {"lr": 1e-3, "warmup_ratio": 0.0},
            "quality_sample": 8,
        }
        return JobSpec.model_validate({**base, **kw})

    return make
