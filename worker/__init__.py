"""The worker: runs training jobs that the API queued, as Celery tasks or in-process.

    api ──(job row committed, then run_job(job_id) on the broker)──> worker.tasks.run_job
        └─> worker.runner.Runner.run(job_id): claim (guarded UPDATE) → fetch data and the
            last checkpoint → `python -m trainer run` subprocess → tail its files into the DB,
            upload checkpoints → finish

Modules: config (WorkerSettings), routing (which queue, how many processes, the trainer
command line), tail (reading the trainer's JSONL files as they grow), runner (one job
attempt), reaper (expired leases and lost messages), celery_app + tasks (Celery),
embedded (BROKER_URL=memory://: a thread in the API process). No torch is imported here:
training always runs in a subprocess.
"""
