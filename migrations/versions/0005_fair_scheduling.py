"""fair scheduling: teams.last_started_at (round robin among teams), jobs.runtime_seconds
(max_runtime over all attempts)

Revision 0005_fair_scheduling, after 0004, 2026-11-23.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005_fair_scheduling"
down_revision: str | None = "0004"


def upgrade() -> None:
    op.add_column("teams", sa.Column("last_started_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "jobs",
        sa.Column("runtime_seconds", sa.Float(), server_default="0", nullable=False),
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("runtime_seconds")
    with op.batch_alter_table("teams") as batch:
        batch.drop_column("last_started_at")
