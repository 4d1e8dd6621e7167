from .evaluations import AsyncEvaluations, Evaluations
from .files import AsyncFiles, Files
from .jobs import AsyncJobs, Jobs
from .reports import AsyncReports, Reports
from .webhooks import AsyncWebhooks, Webhooks

__all__ = [
    "AsyncEvaluations",
    "AsyncFiles",
    "AsyncJobs",
    "AsyncReports",
    "AsyncWebhooks",
    "Evaluations",
    "Files",
    "Jobs",
    "Reports",
    "Webhooks",
]
