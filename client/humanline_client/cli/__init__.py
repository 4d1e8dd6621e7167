"""`humanline`: the user-side command line of the Humanline service, one module per
resource (files, jobs and job_outputs, evals, reports, webhooks) on the application in _app.

    humanline files upload prefs.jsonl
    humanline jobs create --objective dpo --variant offline+humanline \
        --model smollm2-135m-instruct --file file-... --set adapter.kind=lora \
        --set optim.lr=1e-6 --wait
    humanline jobs create --spec job.yaml --file prefs.jsonl
    humanline jobs list --status running --json
    humanline jobs download-model job-... -o model/
    humanline evals create --job job-... --file math.jsonl --kind math --wait
    humanline jobs report job-... --html report.html --open
    humanline webhooks create https://example.com/hooks -e job.succeeded -e job.failed

Tables for people, `--json` for scripts. Configuration: --base-url/--api-key or
HUMANLINE_BASE_URL/HUMANLINE_API_KEY. Server-side commands (migrate, create-team, create-key,
serve) belong to `humanline-server`, which ships with the service, not with this SDK.
"""

from __future__ import annotations

from . import evals, files, job_outputs, jobs, reports, webhooks  # noqa: F401 - they add commands
from ._app import app

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point (`humanline`)."""
    app()
