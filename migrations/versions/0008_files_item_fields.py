"""files.item_fields: which lines of a prompt file hold which fields (contract.items), so a job
whose grader reads a field some line lacks is refused at creation

Revision 0008, after 0007, 2026-11-28. Files uploaded before it have none (NULL): their jobs
are checked by the worker when the grader renders a missing field.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0008"
down_revision: str | None = "0007"


def upgrade() -> None:
    op.add_column("files", sa.Column("item_fields", JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.drop_column("item_fields")
