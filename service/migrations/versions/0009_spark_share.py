"""Each attempt records the Spark server it runs on and when it was claimed, so that claims can bound the merges
running at once on one server (``service.claims.SparkShare``).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from service.models import UTCDateTime

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("merge_jobs", sa.Column("spark_server", sa.String(200), nullable=True))
    op.add_column("merge_jobs", sa.Column("claimed_at", UTCDateTime(), nullable=True))


def downgrade() -> None:
    # SQLite (3.35+) drops a plain column in place, which keeps the table and its seq counter.
    op.execute("ALTER TABLE merge_jobs DROP COLUMN claimed_at")
    op.execute("ALTER TABLE merge_jobs DROP COLUMN spark_server")
