"""Python SDK for the Humanline fine-tuning service (DPO, KTO, GRPO and their humanline
variants).

    from humanline_client import Client
    client = Client()        # HUMANLINE_BASE_URL, HUMANLINE_API_KEY
    for job in client.jobs.list(status="running"):
        print(job.id, job.current_step)

    ev = client.evaluations.create(job_id="job-...", file_id="file-...", kind="math")
    print(client.evaluations.wait(ev.id).metrics["pass_at_1"])
    client.jobs.report("job-...", format="html", to="report.html")

The command-line tool is `humanline` (pip install 'humanline-client[cli]'); the service's
own admin/serve commands are `humanline-server`, shipped with the service, not here.
"""

from ._client import AsyncClient, Client
from ._exceptions import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    EvaluationWaitTimeout,
    HumanlineError,
    InternalServerError,
    JobWaitTimeout,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    RequestTooLargeError,
    UnprocessableEntityError,
)
from ._retries import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, NOT_GIVEN
from ._streaming import AsyncJobEventStream, JobEventStream
from ._version import __version__
from .pagination import AsyncCursorPage, AsyncPaginator, CursorPage, SyncPaginator
from .resources.webhooks import WebhookVerificationError, verify_webhook
from .types import (
    Checkpoint,
    Comparison,
    ComparisonGroup,
    ComparisonGroups,
    ComparisonRow,
    ComparisonTest,
    Evaluation,
    EvaluationReport,
    FileDeleted,
    FileObject,
    Job,
    JobEstimate,
    JobEvent,
    JobReport,
    JobTraining,
    Metric,
)
from .webhook_types import Webhook, WebhookDelivery

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_TIMEOUT",
    "NOT_GIVEN",
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APITimeoutError",
    "AsyncClient",
    "AsyncCursorPage",
    "AsyncJobEventStream",
    "AsyncPaginator",
    "AuthenticationError",
    "BadRequestError",
    "Checkpoint",
    "Client",
    "Comparison",
    "ComparisonGroup",
    "ComparisonGroups",
    "ComparisonRow",
    "ComparisonTest",
    "ConflictError",
    "CursorPage",
    "Evaluation",
    "EvaluationReport",
    "EvaluationWaitTimeout",
    "FileDeleted",
    # objects
    "FileObject",
    # errors
    "HumanlineError",
    "InternalServerError",
    "Job",
    "JobEstimate",
    "JobEvent",
    "JobEventStream",
    "JobReport",
    "JobTraining",
    "JobWaitTimeout",
    "Metric",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestTooLargeError",
    "SyncPaginator",
    "UnprocessableEntityError",
    "Webhook",
    "WebhookDelivery",
    "WebhookVerificationError",
    "__version__",
    "verify_webhook",
]
