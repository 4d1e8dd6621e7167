"""jobs.model_bytes: the exported model's bytes, counted by the per-team storage quota

Revision 0006, after 0005_fair_scheduling, 2026-11-24.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005_fair_scheduling"


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("model_bytes", sa.BigInteger(), nullable=False, server_default="0")
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("model_bytes")
