"""Idempotency keys are scoped per caller: the key is unique together with the caller's token fingerprint.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCOPE = sa.Column("idempotency_scope", sa.String(64), nullable=False, server_default="")
# SQLite's unique column constraint has no name; reflection under this convention gives it one to drop.
SQLITE_NAMES = {"uq": "uq_%(table_name)s_%(column_0_name)s"}


def upgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        # SQLite drops a constraint only by rebuilding the table; AUTOINCREMENT is not reflected, so it is named
        # again (``seq`` is a Delta txn version and must never be handed out twice).
        bind = op.get_bind()
        issued = bind.execute(sa.text("SELECT seq FROM sqlite_sequence WHERE name = 'merge_jobs'")).scalar()
        with op.batch_alter_table(
            "merge_jobs", naming_convention=SQLITE_NAMES, table_kwargs={"sqlite_autoincrement": True}
        ) as batch:
            batch.add_column(SCOPE)
            batch.drop_constraint("uq_merge_jobs_idempotency_key", type_="unique")
        if issued is not None:  # the copy knows only the rows still there, not the highest seq ever issued
            bind.execute(
                sa.text("UPDATE sqlite_sequence SET seq = max(seq, :issued) WHERE name = 'merge_jobs'"),
                {"issued": issued},
            )
    else:
        op.add_column("merge_jobs", SCOPE)
        op.drop_constraint("merge_jobs_idempotency_key_key", "merge_jobs", type_="unique")
    op.create_index("ux_merge_jobs_idempotency", "merge_jobs", ["idempotency_scope", "idempotency_key"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_merge_jobs_idempotency", "merge_jobs")
    if op.get_context().dialect.name == "sqlite":
        with op.batch_alter_table("merge_jobs", table_kwargs={"sqlite_autoincrement": True}) as batch:
            batch.drop_column("idempotency_scope")
            batch.create_unique_constraint("uq_merge_jobs_idempotency_key", ["idempotency_key"])
    else:
        op.drop_column("merge_jobs", "idempotency_scope")
        op.create_unique_constraint("merge_jobs_idempotency_key_key", "merge_jobs", ["idempotency_key"])
