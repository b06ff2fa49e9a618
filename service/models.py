"""The job table. One row per merge job; ``seq`` orders a table's jobs and is the Delta ``txn`` version."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

JsonType = JSON().with_variant(JSONB(), "postgresql")
SeqType = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out; stored naive-UTC on SQLite so text comparison orders correctly."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the job table")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "merge_jobs"
    __table_args__ = (
        Index("ix_merge_jobs_submitted", "submitted_at", "id"),
        Index("ix_merge_jobs_target_status_seq", "target_key", "status", "seq"),
        Index("ix_merge_jobs_status_seq", "status", "seq"),
        # At most one running job per table: the claim query's rule, backed by the database.
        Index(
            "ux_merge_jobs_running_target",
            "target_key",
            unique=True,
            sqlite_where=text("status = 'running'"),
            postgresql_where=text("status = 'running'"),
        ),
        # An Idempotency-Key names one job per caller (per API token; one scope when there are no tokens).
        Index("ux_merge_jobs_idempotency", "idempotency_scope", "idempotency_key", unique=True),
        # A token lists its own jobs, newest first.
        Index("ix_merge_jobs_scope_submitted", "idempotency_scope", "submitted_at", "id"),
        # The operations page: failures and finished merges by finish time, and counts per table and status.
        Index("ix_merge_jobs_status_finished", "status", "finished_at", "id"),
        Index("ix_merge_jobs_scope_status_finished", "idempotency_scope", "status", "finished_at", "id"),
        Index("ix_merge_jobs_scope_target_status", "idempotency_scope", "target_key", "status"),
        {"sqlite_autoincrement": True},
    )

    seq: Mapped[int] = mapped_column(SeqType, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(26), unique=True, nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    phase: Mapped[str] = mapped_column(String(32), nullable=False)
    target: Mapped[str] = mapped_column(Text, nullable=False)
    target_key: Mapped[str] = mapped_column(Text, nullable=False)
    spec: Mapped[dict[str, Any]] = mapped_column(JsonType, nullable=False)
    dry_run: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    engine: Mapped[str] = mapped_column(String(16), nullable=False, default="builtin", server_default="builtin")
    """Which engine runs the job (``service.engines``); jobs from before the choice existed ran on the builtin one."""
    submitted_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    table_version: Mapped[int | None] = mapped_column(BigInteger)
    result: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    timings: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    """Where a finished job's time went, milliseconds by segment (``service.timeline``)."""
    error: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    idempotency_scope: Mapped[str] = mapped_column(String(64), nullable=False, default="", server_default="")
    """The fingerprint of the submitting caller's API token, or empty when the deployment has no tokens. It scopes
    the Idempotency-Key and who may read, list and cancel the job (that token, and admin tokens)."""
    request_hash: Mapped[str | None] = mapped_column(String(64))
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    commit_started: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False, server_default=false())
    """Some attempt entered ``committing``: its commit may have landed, so a cancel waits for an attempt to
    look for the job's txn in the table."""
    awaits_spark: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False, server_default=false())
    """The last attempt left an AUTO CDC batch half applied with Spark away: the job has no attempt limit until an
    attempt ends otherwise (``service.errors.BatchAwaitsSparkError``)."""
    next_run_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    callback_url: Mapped[str | None] = mapped_column(Text)
    """Where the job's completion callback goes (``service.callback_delivery``); None for no callback."""


class CallbackDelivery(Base):
    """The outbox of completion callbacks: one row per event of a job with a callback (``started`` in the
    transaction that starts its first attempt, its end in the one that makes it final), so a worker killed after
    that commit cannot lose the delivery."""

    __tablename__ = "merge_callbacks"
    __table_args__ = (
        Index("ix_merge_callbacks_due", "status", "next_attempt_at"),
        UniqueConstraint("job_id", "event", name="uq_merge_callbacks_job_event"),
    )

    id: Mapped[str] = mapped_column(String(26), primary_key=True)
    """The delivery id, sent with every attempt so that receivers can drop repeats."""
    job_id: Mapped[str] = mapped_column(String(26), nullable=False)
    event: Mapped[str] = mapped_column(String(16), nullable=False)
    """A ``CallbackEvent``: ``started`` or the status the job ended with."""
    key_id: Mapped[str | None] = mapped_column(String(64))
    """The id of the key that signed the latest attempt (never the key): which secret a receiver checks with."""
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


jobs = cast(Table, Job.__table__)
callbacks = cast(Table, CallbackDelivery.__table__)
