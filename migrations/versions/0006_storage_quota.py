"""jobs.model_bytes: the exported model's bytes, counted by the per-team storage quota

Revision ID: 0006
Revises: 0004
Create Date: 2026-11-24

(Another branch of issue 14 may add 0005; whichever merges second revises the other.)
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005_fair_scheduling"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("model_bytes", sa.BigInteger(), nullable=False, server_default="0")
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("model_bytes")
