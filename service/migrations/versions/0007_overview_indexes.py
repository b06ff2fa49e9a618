"""The operations page counts and lists jobs per status, per table and by finish time, for one token or all:
indexes so each of its queries reads an index range instead of the whole job table.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_merge_jobs_status_finished", "merge_jobs", ["status", "finished_at", "id"], unique=False)
    op.create_index(
        "ix_merge_jobs_scope_status_finished",
        "merge_jobs",
        ["idempotency_scope", "status", "finished_at", "id"],
        unique=False,
    )
    op.create_index(
        "ix_merge_jobs_scope_target_status", "merge_jobs", ["idempotency_scope", "target_key", "status"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_merge_jobs_scope_target_status", "merge_jobs")
    op.drop_index("ix_merge_jobs_scope_status_finished", "merge_jobs")
    op.drop_index("ix_merge_jobs_status_finished", "merge_jobs")
