"""Each finished job keeps where its time went (``service.timeline``); jobs that ended before have none.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("merge_jobs", sa.Column("timings", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=True))


def downgrade() -> None:
    # SQLite (3.35+) drops a plain column in place, which keeps the table and its seq counter.
    op.execute("ALTER TABLE merge_jobs DROP COLUMN timings")
