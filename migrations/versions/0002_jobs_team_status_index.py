"""jobs: index (team_id, status) for the per-team active-job quota

Revision 0002, after 0001, 2026-11-21.
"""

from __future__ import annotations

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"


def upgrade() -> None:
    op.create_index("ix_jobs_team_id_status", "jobs", ["team_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_jobs_team_id_status", table_name="jobs")
