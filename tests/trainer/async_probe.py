"""`python -m tests.trainer.async_probe run SPEC --out DIR`: the trainer's CLI with the async
sampler replaced by the in-process oracle of the same fixed-lag schedule
(tests.trainer.test_async_online.Lagged), so a test launched like the worker's (several
processes) can compare an async job with it."""

from __future__ import annotations

import sys

from tests.trainer.test_async_online import Lagged
from trainer.__main__ import app
from trainer.online import async_data

async_data.AsyncOnlineData.pipeline = Lagged

if __name__ == "__main__":
    sys.exit(app())
