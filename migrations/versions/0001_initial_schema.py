"""initial schema

Revision 0001, the first, 2026-11-21.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# Written against the tables of models/tables.py (tests/models/test_migrations.py checks that
# they agree): timestamps are timestamptz (UTC), JSON is JSONB on PostgreSQL.
TIMESTAMP = sa.DateTime(timezone=True)
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0001"
down_revision: str | None = None


def _of_a_job(name: str, unique: str, *columns: sa.Column) -> None:
    """A table of rows that belong to one job (models.tables.OfAJob), unique on (job, `unique`)."""
    op.create_table(
        name,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        *columns,
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f(f"fk_{name}_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{name}")),
        sa.UniqueConstraint("job_id", unique, name=op.f(f"uq_{name}_job_id_{unique}")),
    )


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_teams")),
        sa.UniqueConstraint("name", name=op.f("uq_teams_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("team_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("revoked_at", TIMESTAMP, nullable=True),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_api_keys_team_id_teams"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("secret_hash", name=op.f("uq_api_keys_secret_hash")),
    )
    op.create_index(op.f("ix_api_keys_team_id"), "api_keys", ["team_id"])

    op.create_table(
        "files",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("team_id", sa.String(length=40), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("purpose", sa.String(length=16), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("format", sa.String(length=32), nullable=True),
        sa.Column("records", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", JSON, nullable=True),
        sa.Column("object_key", sa.String(length=512), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.CheckConstraint("purpose IN ('train', 'eval')", name=op.f("ck_files_purpose")),
        sa.CheckConstraint(
            "status IN ('uploaded', 'processed', 'error')", name=op.f("ck_files_status")
        ),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_files_team_id_teams"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_files")),
    )
    op.create_index(op.f("ix_files_team_id"), "files", ["team_id"])

    op.create_table(
        "idempotency_keys",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("team_id", sa.String(length=40), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("method_path", sa.String(length=300), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("response_status", sa.Integer(), nullable=False),
        sa.Column("response_body", JSON, nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["team_id"],
            ["teams.id"],
            name=op.f("fk_idempotency_keys_team_id_teams"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_idempotency_keys")),
        sa.UniqueConstraint("team_id", "key", name=op.f("uq_idempotency_keys_team_id_key")),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("team_id", sa.String(length=40), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("metadata", JSON, nullable=False),
        sa.Column("base_model", sa.String(length=255), nullable=False),
        sa.Column("objective", sa.String(length=16), nullable=False),
        sa.Column("training_file_id", sa.String(length=40), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", TIMESTAMP, nullable=True),
        sa.Column("heartbeat_at", TIMESTAMP, nullable=True),
        sa.Column("current_step", sa.Integer(), nullable=False),
        sa.Column("total_steps", sa.Integer(), nullable=True),
        sa.Column("event_seq", sa.Integer(), nullable=False),
        sa.Column("error", JSON, nullable=True),
        sa.Column("result", JSON, nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.Column("started_at", TIMESTAMP, nullable=True),
        sa.Column("finished_at", TIMESTAMP, nullable=True),
        sa.CheckConstraint(
            "status IN ('validating', 'queued', 'running', 'cancelling', 'cancelled', "
            "'succeeded', 'failed')",
            name=op.f("ck_jobs_status"),
        ),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_jobs_team_id_teams"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["training_file_id"],
            ["files.id"],
            name=op.f("fk_jobs_training_file_id_files"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    op.create_index("ix_jobs_status_lease_expires_at", "jobs", ["status", "lease_expires_at"])
    op.create_index("ix_jobs_team_id_id", "jobs", ["team_id", "id"])
    op.create_index(op.f("ix_jobs_training_file_id"), "jobs", ["training_file_id"])

    _of_a_job(
        "checkpoints",
        "step",
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("object_prefix", sa.String(length=512), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("files", JSON, nullable=True),
    )
    _of_a_job(
        "job_events",
        "seq",
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", JSON, nullable=True),
    )
    _of_a_job(
        "job_metrics",
        "step",
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("values", JSON, nullable=False),
    )
    op.create_table(
        "evaluations",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("team_id", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=True),
        sa.Column("checkpoint_id", sa.Integer(), nullable=True),
        sa.Column("base_model", sa.String(length=255), nullable=True),
        sa.Column("file_id", sa.String(length=40), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("config", JSON, nullable=True),
        sa.Column("result", JSON, nullable=True),
        sa.Column("error", JSON, nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.Column("finished_at", TIMESTAMP, nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name=op.f("ck_evaluations_status"),
        ),
        sa.ForeignKeyConstraint(
            ["checkpoint_id"],
            ["checkpoints.id"],
            name=op.f("fk_evaluations_checkpoint_id_checkpoints"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["file_id"],
            ["files.id"],
            name=op.f("fk_evaluations_file_id_files"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_evaluations_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_evaluations_team_id_teams"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evaluations")),
    )
    op.create_index(op.f("ix_evaluations_job_id"), "evaluations", ["job_id"])
    op.create_index("ix_evaluations_team_id_id", "evaluations", ["team_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_evaluations_team_id_id", table_name="evaluations")
    op.drop_index(op.f("ix_evaluations_job_id"), table_name="evaluations")

    op.drop_table("evaluations")
    op.drop_table("job_metrics")
    op.drop_table("job_events")
    op.drop_table("checkpoints")
    op.drop_index(op.f("ix_jobs_training_file_id"), table_name="jobs")
    op.drop_index("ix_jobs_team_id_id", table_name="jobs")
    op.drop_index("ix_jobs_status_lease_expires_at", table_name="jobs")

    op.drop_table("jobs")
    op.drop_table("idempotency_keys")
    op.drop_index(op.f("ix_files_team_id"), table_name="files")

    op.drop_table("files")
    op.drop_index(op.f("ix_api_keys_team_id"), table_name="api_keys")

    op.drop_table("api_keys")
    op.drop_table("teams")
