"""jobs.launcher and jobs.launch: how a job's attempts are started, and where the control
plane stands with a multi-node job's current launch (worker.reconcile)

Revision 0009, after 0008, 2026-11-28. `launcher` is NULL for jobs the worker runs itself
(the local subprocess) and 'trainjob' for a multi-node job (Kubeflow Trainer), decided when
the job is first launched; `launch` is the reconcile state of its current attempt.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0009"
down_revision: str | None = "0008"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("launcher", sa.String(16), nullable=True))
    op.add_column("jobs", sa.Column("launch", JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("launch")
        batch.drop_column("launcher")
