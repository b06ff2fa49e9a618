"""What the API reads: one job, a page of jobs behind an opaque cursor, the queue's depth and age."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Column, Select, and_, bindparam, func, or_, select

from service.errors import InvalidCursorError, JobNotFoundError
from service.jobs import JobRecord, QueueStats, Status
from service.models import jobs
from service.store import JobStore, job_record, select_records

# Built once, as the API's hot statements are (see ``service.submissions``).
SELECT_JOB = select_records().where(jobs.c.id == bindparam("job_id"))
# A job belongs to the caller whose token fingerprint scopes its Idempotency-Key: the token that submitted it.
SELECT_OWN_JOB = SELECT_JOB.where(jobs.c.idempotency_scope == bindparam("owner"))


def encode_cursor(submitted_at: datetime, job_id: str) -> str:
    raw = json.dumps([submitted_at.astimezone(UTC).isoformat(), job_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stamp, job_id = json.loads(raw)
        when = datetime.fromisoformat(stamp)
        if when.tzinfo is None or not isinstance(job_id, str):
            raise ValueError("bad cursor")
        return when, job_id
    except (ValueError, TypeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidCursorError("query cursor: the cursor is not one this service issued.") from exc


def newest_first(
    store: JobStore, stmt: Select[Any], column: Column[Any], cursor: str | None, limit: int
) -> tuple[list[JobRecord], str | None]:
    """One page of ``stmt``'s jobs, latest ``column`` first, after the cursor (keyset paging over ``column`` and
    the job id); and the cursor of the next page, if there is one. ``column`` is a time every listed job has."""
    if cursor is not None:
        when, job_id = decode_cursor(cursor)
        stmt = stmt.where(or_(column < when, and_(column == when, jobs.c.id < job_id)))
    stmt = stmt.order_by(column.desc(), jobs.c.id.desc()).limit(limit + 1)
    with store._tx(write=False) as conn:
        rows = conn.execute(stmt).all()
    items = [job_record(r) for r in rows[:limit]]
    if len(rows) <= limit or not items or getattr(items[-1], column.name) is None:
        return items, None
    return items, encode_cursor(getattr(items[-1], column.name), items[-1].id)


class JobQueries(JobStore):
    """The API's reads."""

    def get(self, job_id: str, *, owner: str | None = None) -> JobRecord:
        """The job; with ``owner``, only if that caller submitted it (another's job is as unknown as a
        missing one)."""
        with self._tx(write=False, single_read=True) as conn:
            if owner is None:
                row = conn.execute(SELECT_JOB, {"job_id": job_id}).first()
            else:
                row = conn.execute(SELECT_OWN_JOB, {"job_id": job_id, "owner": owner}).first()
        if row is None:
            raise JobNotFoundError(job_id)
        return job_record(row)

    def get_spec(self, job_id: str) -> dict[str, Any]:
        with self._tx(write=False) as conn:
            spec = conn.execute(select(jobs.c.spec).where(jobs.c.id == job_id)).scalar_one_or_none()
        if spec is None:
            raise JobNotFoundError(job_id)
        return spec

    def list_jobs(
        self,
        *,
        status: Status | None = None,
        target_key: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        owner: str | None = None,
    ) -> tuple[list[JobRecord], str | None]:
        """Newest first, only ``owner``'s jobs when given; the cursor is opaque to callers and points past the
        last item of the previous page."""
        stmt = select_records()
        if owner is not None:
            stmt = stmt.where(jobs.c.idempotency_scope == owner)
        if status is not None:
            stmt = stmt.where(jobs.c.status == status.value)
        if target_key is not None:
            stmt = stmt.where(jobs.c.target_key == target_key)
        return newest_first(self, stmt, jobs.c.submitted_at, cursor, limit)

    def queue_stats(self) -> QueueStats:
        with self._tx(write=False) as conn:
            depth, oldest = conn.execute(
                select(func.count(), func.min(jobs.c.submitted_at)).where(jobs.c.status == Status.QUEUED.value)
            ).one()
            running = conn.execute(select(func.count()).where(jobs.c.status == Status.RUNNING.value)).scalar_one()
        age = 0.0
        if oldest is not None:
            if isinstance(oldest, str):  # SQLite may hand back an aggregate's raw text
                oldest = datetime.fromisoformat(oldest)
            if oldest.tzinfo is None:
                oldest = oldest.replace(tzinfo=UTC)
            age = max(0.0, (self.clock() - oldest).total_seconds())
        return QueueStats(depth=int(depth), oldest_age_seconds=age, running=int(running))
