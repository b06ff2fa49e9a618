"""Completion callbacks: a job may name a callback URL, and its deliveries (one per event of a job: ``started``
and its end) wait in an outbox table.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from service.models import UTCDateTime

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("merge_jobs", sa.Column("callback_url", sa.Text()))
    op.create_table(
        "merge_callbacks",
        sa.Column("id", sa.String(26), primary_key=True),
        sa.Column("job_id", sa.String(26), nullable=False),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("key_id", sa.String(64)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
        sa.Column("lease_owner", sa.String(200)),
        sa.Column("lease_expires_at", UTCDateTime()),
        sa.Column("last_error", sa.Text()),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("delivered_at", UTCDateTime()),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("job_id", "event", name="uq_merge_callbacks_job_event"),
    )
    op.create_index("ix_merge_callbacks_due", "merge_callbacks", ["status", "next_attempt_at"])


def downgrade() -> None:
    op.drop_index("ix_merge_callbacks_due", "merge_callbacks")
    op.drop_table("merge_callbacks")
    # SQLite (3.35+) drops a plain column in place, which keeps the table and its seq counter.
    op.execute("ALTER TABLE merge_jobs DROP COLUMN callback_url")
