"""jobs: index (team_id, status) for the per-team active-job quota

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_team_id_status", "jobs", ["team_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_jobs_team_id_status", table_name="jobs")
