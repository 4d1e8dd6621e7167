"""files: purpose 'fine-tune' (OpenAI's name for a training file); warnings column

Revision 0004, after 0003, 2026-11-23.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0004"
down_revision: str | None = "0003"


def _purposes(sql: str) -> None:
    # batch mode: SQLite cannot alter a CHECK constraint in place (it copies the table)
    with op.batch_alter_table("files") as batch:
        batch.drop_constraint(op.f("ck_files_purpose"), type_="check")
        batch.create_check_constraint("purpose", sql)


def upgrade() -> None:
    _purposes("purpose IN ('train', 'eval', 'fine-tune')")
    op.add_column("files", sa.Column("warnings", JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.drop_column("warnings")
    op.execute("UPDATE files SET purpose = 'train' WHERE purpose = 'fine-tune'")
    _purposes("purpose IN ('train', 'eval')")
