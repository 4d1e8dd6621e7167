"""`python -m tests.trainer.oom_child run SPEC --out DIR`: the trainer's CLI with an injected
out-of-memory error: every policy forward of more than HUMANLINE_TEST_OOM_ROWS rows raises
torch.OutOfMemoryError (the CPU stand-in for a GPU running out of memory), and so does the
HUMANLINE_TEST_OOM_CALL-th policy forward of the process (once: after earlier backwards)."""

import os
import sys

import torch

import trainer.train
from trainer.__main__ import app

LIMIT = int(os.environ.get("HUMANLINE_TEST_OOM_ROWS", "0"))
CALL = int(os.environ.get("HUMANLINE_TEST_OOM_CALL", "0"))
real = trainer.train.batch_logps
calls = [0]


def limited(model, batch, temperature=1.0):
    calls[0] += 1
    if calls[0] == CALL:
        raise torch.OutOfMemoryError(f"injected: policy forward {CALL}")
    if LIMIT and batch.input_ids.shape[0] > LIMIT:
        raise torch.OutOfMemoryError(f"injected: {batch.input_ids.shape[0]} rows > {LIMIT}")
    return real(model, batch, temperature)


trainer.train.batch_logps = limited

if __name__ == "__main__":
    sys.exit(app())
