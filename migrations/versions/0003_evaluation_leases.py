"""evaluations: lease columns (one lease scheme for jobs and evaluations, models.leases)

Revision 0003, after 0002, 2026-11-23.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"

TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("evaluations") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("lease_owner", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("lease_expires_at", TIMESTAMP, nullable=True))
        batch.add_column(sa.Column("heartbeat_at", TIMESTAMP, nullable=True))
    op.create_index(
        "ix_evaluations_status_lease_expires_at", "evaluations", ["status", "lease_expires_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_evaluations_status_lease_expires_at", table_name="evaluations")
    with op.batch_alter_table("evaluations") as batch:
        batch.drop_column("heartbeat_at")
        batch.drop_column("lease_expires_at")
        batch.drop_column("lease_owner")
        batch.drop_column("attempt")
