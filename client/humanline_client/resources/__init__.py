from .files import AsyncFiles, Files
from .jobs import AsyncJobs, Jobs

__all__ = ["AsyncFiles", "AsyncJobs", "Files", "Jobs"]
