"""The HTTP API (FastAPI) under /v1. Imports contract, reports, models and storage; never torch.
Its modules:

    main            create_app(settings): settings, DB, store, work queues, middleware, routes
    routes/         files, jobs, evaluations, reports, fine_tuning (OpenAI's surface), health
    deps            FastAPI dependencies: session, object store, auth (bearer keys), idempotency
    queues          the work queues (Celery, embedded in-process worker, background sender)
    owned, paging   "owned by this team or 404" and cursor pages, once each
    admission       what a job or an evaluation must pass before its row is written
    caps            operator caps on a spec's resource fields (CAP_* settings)
    estimates       a job's cost estimate on this deployment's job queue (JOB_DEVICE_KIND)
    uploads         one-pass upload: multipart parse, line-by-line validation, hash, store
    bodypump        an upload's body read in the event loop, with an idle timeout
    limits          uploads and event streams in progress, per team and in all (429/503)
    embedded        the embedded default in one process, for the demo and the replication
    downloads       serving one stored file (checkpoints, the exported model)
    openai_compat   OpenAI's fine-tuning shapes <-> our JobSpec and rows (no SQL, no HTTP)
    schemas, schemas_eval   response models (jobs, files; evaluations, reports)
    errors          api_error (what routes raise) and the handlers that answer every error
    error_bodies    the one error shape (OpenAI's fields and ours), below observability
    observability   request ids, JSON logs, Prometheus metrics, body-size limit
    keycache, ratelimit   verified keys remembered briefly; failed-auth token buckets
    cli             `humanline-server`: migrate, create-team, create-key, keys, serve
"""
