"""The routers api.main mounts: one module per resource, each thin over models/ (the SQL)
and api/ (shapes, checks, queues).

    files         /v1/files                  upload (validated while streaming), list, get,
                                             content, delete
    jobs          /v1/jobs                   create, list, get, cancel, events (paged and SSE),
                                             metrics, checkpoints (+ download), model download
    evaluations   /v1/evaluations            create, list, get, the stored report
    reports       /v1/jobs/{id}/report, /v1/reports/compare (rendered from the DB on request)
    webhooks      /v1/webhooks               create (secret shown once), list, get, delete,
                                             delivery log
    fine_tuning   /v1/fine_tuning/jobs, /v1/models: OpenAI's surface over the same jobs
    health        /healthz, /readyz, /metrics (outside /v1)
"""
