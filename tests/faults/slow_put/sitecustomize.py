"""Loaded at start-up by a process whose PYTHONPATH begins with this directory (the fault
tests' Celery worker): with HUMANLINE_TEST_SLOW_CHECKPOINT_PUT_S set, every checkpoint file
the S3 store uploads waits that long first, so a test can SIGKILL the worker while a
checkpoint is half uploaded. The variable is removed at once: the trainer (a child process)
must not pay for importing the store."""

import os

_delay = os.environ.pop("HUMANLINE_TEST_SLOW_CHECKPOINT_PUT_S", "")
if _delay:
    import time

    from storage.s3 import S3Store

    _put_file = S3Store.put_file

    def _slow_put_file(self, key, path):  # type: ignore[no-untyped-def]
        if "/step-" in key:
            time.sleep(float(_delay))
        return _put_file(self, key, path)

    S3Store.put_file = _slow_put_file  # type: ignore[method-assign]
