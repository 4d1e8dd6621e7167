from .files import AsyncFiles, Files
from .jobs import AsyncJobs, Jobs

__all__ = ["Files", "AsyncFiles", "Jobs", "AsyncJobs"]
