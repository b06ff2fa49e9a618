"""Jobs are scoped to the token that submitted them: an index for a token's own listing, newest first.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_merge_jobs_scope_submitted", "merge_jobs", ["idempotency_scope", "submitted_at", "id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_merge_jobs_scope_submitted", "merge_jobs")
