"""The worker: runs the jobs and evaluations that the API queued, as Celery tasks or
in-process.

    api ──(row committed, then run_job(job_id) on the broker)──> worker.tasks.run_job
        └─> worker.runner.Runner.run(job_id) → one worker.attempt.LeasedAttempt:
            claim (guarded UPDATE, models.leases) → prepare (data, last checkpoint) →
            `python -m trainer run` subprocess → tail its files into the DB, upload
            checkpoints (heartbeat and fence throughout) → conclude

Modules: attempt (the one leased attempt: claim → prepare → subprocess → tail → conclude,
heartbeat, fence, kill with the parent), runner (training's prepare and conclude), inputs
(what an attempt downloads and writes before the launch), micro_batch (an out-of-memory end:
the finer micro-batch the next attempt uses), progress (a run's files into the DB and the
store), evaluate (evaluation's prepare and conclude), warm (evaluations forked from a process
that imported torch once: EVAL_WARM_START), job_evaluations (evaluations a spec names,
created when its job succeeds), config
(WorkerSettings), routing (which queue, how many processes), launch (the trainer's argv),
gpus (WORKER_GPUS and the placement check), launchers (how an attempt's ranks are started
and followed: the local subprocess or a Kubeflow TrainJob, one interface), tail (JSONL
files as they grow), reaper
(expired leases and lost messages), webhooks (webhook deliveries: signed, ordered, retried,
a bounded number of senders per team), webhook_http (one attempt, ended by its deadline),
webhook_thread (the embedded server's pool of senders),
sweeper (orphaned temp files and objects), scrub (no
server path, hostname or pid in what a team reads), celery_app + tasks (Celery), embedded
(BROKER_URL=memory://: a thread in the API process), multinode (a multi-node attempt: its
spec in the store, the ranks' argv), reconcile + reconcile_tick (multi-node jobs: launched by
run_job, followed by the beat task reconcile_jobs; reconcile_context what both share,
reconcile_watch an attempt's clocks: start deadline, hang, admission, submit backoff). No
torch is imported here: training and evaluation always run in a child process (warm's fork
server imports it, not the worker).
"""
