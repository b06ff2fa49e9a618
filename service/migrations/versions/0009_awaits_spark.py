"""A job remembers that its last attempt left an AUTO CDC batch half applied with Spark away: a worker lost during
its next attempt hands it back to the queue whatever its attempt count, as the worker itself does, rather than fail
it with its target changed.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("merge_jobs", sa.Column("awaits_spark", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    # SQLite (3.35+) drops a plain column in place, which keeps the table and its seq counter.
    op.execute("ALTER TABLE merge_jobs DROP COLUMN awaits_spark")
