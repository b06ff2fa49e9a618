"""A job remembers that one of its attempts began committing: from then on a cancel request must wait for an
attempt to find out whether that commit landed, instead of ending the job as "table unchanged".

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("merge_jobs", sa.Column("commit_started", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    # SQLite (3.35+) drops a plain column in place, which keeps the table and its seq counter.
    op.execute("ALTER TABLE merge_jobs DROP COLUMN commit_started")
