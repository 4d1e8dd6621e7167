"""`python -m worker [CELERY WORKER OPTIONS]`: a Celery worker with the service's defaults.

    python -m worker                       # -Q <ingress>,cpu,gpu --pool=solo -c 1
    python -m worker -Q gpu,celery -n gpu1@%h

Same as `celery -A worker.celery_app worker --pool=solo -c 1 -Q celery,cpu,gpu ...`; options
given here replace the defaults. One job per worker process (solo pool): a GPU job owns its
GPUs, and PR_SET_PDEATHSIG ties the trainer to the process that runs the task.
"""

from __future__ import annotations

import sys


def default_args(argv: list[str]) -> list[str]:
    from worker.celery_app import QUEUE_NAMES

    args = ["worker"]
    given = set()
    for a in argv:
        given.add(a.split("=", 1)[0])
    if not given & {"-Q", "--queues"}:
        args += ["-Q", ",".join(QUEUE_NAMES)]
    if not given & {"-P", "--pool"}:
        args += ["--pool=solo"]
    if not given & {"-c", "--concurrency"}:
        args += ["-c", "1"]
    return [*args, *argv]


def main(argv: list[str] | None = None) -> None:
    from worker.celery_app import app

    app.worker_main(default_args(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()
