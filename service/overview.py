"""What the operations page reads: counts per table and status, the running and queued merges, recent failures
and merge durations over time. Every figure is aggregated by the database over indexed columns, and every list is
a bounded page, so the page costs the same with a hundred jobs or a hundred thousand."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Integer, bindparam, cast, extract, func, select, true

from service.jobs import JobRecord, Status
from service.models import UTCDateTime, jobs
from service.queries import newest_first
from service.store import RECORD_COLUMNS, JobStore, job_record

RUNNING_SHOWN = 100
"""Running merges listed at most; one job per table runs at a time, so this is the busiest tables' worth."""


@dataclass(frozen=True)
class TableCounts:
    target_key: str
    counts: dict[Status, int]


@dataclass(frozen=True)
class Bucket:
    """Merges that ended in one slice of the plotted window."""

    index: int
    succeeded: int
    failed: int
    mean_seconds: float | None
    max_seconds: float | None


class JobOverview(JobStore):
    """The operations page's reads. ``owner`` limits each to one caller's jobs, as the API does."""

    def _scoped(self, owner: str | None) -> ColumnElement[bool]:
        return jobs.c.idempotency_scope == owner if owner is not None else true()

    def status_counts(self, *, owner: str | None = None) -> dict[Status, int]:
        stmt = select(jobs.c.status, func.count()).where(self._scoped(owner)).group_by(jobs.c.status)
        with self._tx(write=False) as conn:
            found = {Status(status): int(n) for status, n in conn.execute(stmt)}
        return {status: found.get(status, 0) for status in Status}

    def table_counts(
        self, *, owner: str | None = None, after: str | None = None, limit: int = 25
    ) -> tuple[list[TableCounts], str | None]:
        """A page of tables in path order with their jobs counted per status; the second value is the last
        table of the page when another page follows (the ``after`` of the next one)."""
        keys = select(jobs.c.target_key).where(self._scoped(owner)).group_by(jobs.c.target_key)
        if after is not None:
            keys = keys.where(jobs.c.target_key > after)
        keys = keys.order_by(jobs.c.target_key).limit(limit + 1)
        with self._tx(write=False) as conn:
            page = [key for (key,) in conn.execute(keys)]
            shown = page[:limit]
            counts = conn.execute(
                select(jobs.c.target_key, jobs.c.status, func.count())
                .where(self._scoped(owner), jobs.c.target_key.in_(shown))
                .group_by(jobs.c.target_key, jobs.c.status)
            ).all()
        by_table: dict[str, dict[Status, int]] = {key: dict.fromkeys(Status, 0) for key in shown}
        for key, status, n in counts:
            by_table[key][Status(status)] = int(n)
        tables = [TableCounts(key, by_table[key]) for key in shown]
        return tables, (shown[-1] if len(page) > limit else None)

    def running(self, *, owner: str | None = None) -> list[JobRecord]:
        return self._first_submitted(Status.RUNNING, owner, RUNNING_SHOWN)

    def queued(self, *, owner: str | None = None, limit: int = 20) -> list[JobRecord]:
        """The next queued jobs in submission order (a table's jobs run in this order)."""
        return self._first_submitted(Status.QUEUED, owner, limit)

    def _first_submitted(self, status: Status, owner: str | None, limit: int) -> list[JobRecord]:
        stmt = (
            select(*RECORD_COLUMNS)
            .where(self._scoped(owner), jobs.c.status == status.value)
            .order_by(jobs.c.seq)
            .limit(limit)
        )
        with self._tx(write=False) as conn:
            return [job_record(row) for row in conn.execute(stmt)]

    def failures(
        self, *, owner: str | None = None, before: str | None = None, limit: int = 20
    ) -> tuple[list[JobRecord], str | None]:
        """Failed jobs, the latest to fail first, behind a cursor like the API's (over the finish time)."""
        stmt = select(*RECORD_COLUMNS).where(self._scoped(owner), jobs.c.status == Status.FAILED.value)
        return newest_first(self, stmt, jobs.c.finished_at, before, limit)

    def finished_over_time(
        self, *, since: datetime, width: timedelta, buckets: int, owner: str | None = None
    ) -> list[Bucket]:
        """Merges that ended from ``since`` on, in ``buckets`` slices of ``width``: how many succeeded and
        failed (throughput) and how long the succeeded ones took from their first start (duration)."""
        start = bindparam("since", since, type_=UTCDateTime)
        seconds = width.total_seconds()
        bucket = self._whole(self._seconds(jobs.c.finished_at, start) / seconds).label("bucket")
        duration = self._seconds(jobs.c.finished_at, jobs.c.started_at)
        ok = jobs.c.status == Status.SUCCEEDED.value
        stmt = (
            select(
                bucket,
                func.count().filter(ok),
                func.count(),
                func.avg(duration).filter(ok),
                func.max(duration).filter(ok),
            )
            .where(
                self._scoped(owner),
                jobs.c.status.in_([Status.SUCCEEDED.value, Status.FAILED.value]),
                jobs.c.finished_at >= start,
                jobs.c.finished_at < bindparam("until", since + width * buckets, type_=UTCDateTime),
            )
            .group_by(bucket)
        )
        with self._tx(write=False) as conn:
            rows = conn.execute(stmt).all()
        found = {int(row[0]): row for row in rows}
        out = []
        for i in range(buckets):
            row = found.get(i)
            if row is None:
                out.append(Bucket(i, 0, 0, None, None))
                continue
            succeeded = int(row[1] or 0)
            out.append(Bucket(i, succeeded, int(row[2]) - succeeded, _float(row[3]), _float(row[4])))
        return out

    def _whole(self, value: ColumnElement[Any]) -> ColumnElement[Any]:
        """The whole part of a non-negative number: SQLite's CAST truncates, PostgreSQL's rounds."""
        return cast(value, Integer) if self._sqlite else cast(func.floor(value), Integer)

    def _seconds(self, later: Any, earlier: Any) -> ColumnElement[Any]:
        """``later - earlier`` in seconds, as each database computes it from its own time type."""
        if self._sqlite:
            # julianday() is a day count in a double: exact to the millisecond, so rounded to it.
            return func.round((func.julianday(later) - func.julianday(earlier)) * 86_400_000.0) / 1000.0
        return extract("epoch", later - earlier)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
