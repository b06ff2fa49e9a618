"""The merge job table.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from service.models import UTCDateTime

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JsonType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "merge_jobs",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(26), nullable=False, unique=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("target_key", sa.Text(), nullable=False),
        sa.Column("spec", JsonType, nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("submitted_at", UTCDateTime(), nullable=False),
        sa.Column("started_at", UTCDateTime()),
        sa.Column("finished_at", UTCDateTime()),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("table_version", sa.BigInteger()),
        sa.Column("result", JsonType),
        sa.Column("metrics", JsonType),
        sa.Column("error", JsonType),
        sa.Column("idempotency_key", sa.String(255), unique=True),
        sa.Column("request_hash", sa.String(64)),
        sa.Column("lease_owner", sa.String(200)),
        sa.Column("lease_expires_at", UTCDateTime()),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("next_run_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_merge_jobs_submitted", "merge_jobs", ["submitted_at", "id"])
    op.create_index("ix_merge_jobs_target_status_seq", "merge_jobs", ["target_key", "status", "seq"])
    op.create_index("ix_merge_jobs_status_seq", "merge_jobs", ["status", "seq"])
    op.create_index(
        "ux_merge_jobs_running_target",
        "merge_jobs",
        ["target_key"],
        unique=True,
        sqlite_where=sa.text("status = 'running'"),
        postgresql_where=sa.text("status = 'running'"),
    )


def downgrade() -> None:
    op.drop_table("merge_jobs")
