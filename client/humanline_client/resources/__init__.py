from .evaluations import AsyncEvaluations, Evaluations
from .files import AsyncFiles, Files
from .jobs import AsyncJobs, Jobs
from .reports import AsyncReports, Reports

__all__ = [
    "AsyncEvaluations",
    "AsyncFiles",
    "AsyncJobs",
    "AsyncReports",
    "Evaluations",
    "Files",
    "Jobs",
    "Reports",
]
