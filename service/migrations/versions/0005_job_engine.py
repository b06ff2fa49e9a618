"""Each job names the engine that runs it; jobs stored before the choice existed ran on the builtin one.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("merge_jobs", sa.Column("engine", sa.String(16), nullable=False, server_default="builtin"))


def downgrade() -> None:
    # SQLite (3.35+) drops a plain column in place, which keeps the table and its seq counter.
    op.execute("ALTER TABLE merge_jobs DROP COLUMN engine")
