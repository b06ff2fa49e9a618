"""The job database that the store's rooms share: its engine, its transactions (SQLite's one writer at a time,
PostgreSQL's autocommit single reads), the schema's level, and how a job row becomes a ``JobRecord``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any, Self

from sqlalchemy import Connection, Engine, Row, Select, and_, select
from sqlalchemy import exc as sa_exc

from service import migrate
from service.db import SQLITE_BUSY_TIMEOUT_MS, create_db_engine, is_sqlite
from service.errors import DatabaseUnavailableError
from service.jobs import CallbackEvent, CallbackState, DeliveryStatus, JobRecord, Phase, Status
from service.models import callbacks, jobs
from service.timeline import in_order

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)


RECORD_COLUMNS = (
    jobs.c.id,
    jobs.c.seq,
    jobs.c.status,
    jobs.c.phase,
    jobs.c.target,
    jobs.c.target_key,
    jobs.c.dry_run,
    jobs.c.submitted_at,
    jobs.c.started_at,
    jobs.c.finished_at,
    jobs.c.attempts,
    jobs.c.table_version,
    jobs.c.result,
    jobs.c.metrics,
    jobs.c.error,
    jobs.c.cancel_requested,
    jobs.c.engine,
    jobs.c.callback_url,
    jobs.c.timings,
)
DELIVERY_COLUMNS = (
    callbacks.c.id.label("delivery_id"),
    callbacks.c.status.label("delivery_status"),
    callbacks.c.attempts.label("delivery_attempts"),
    callbacks.c.last_error.label("delivery_last_error"),
    callbacks.c.delivered_at.label("delivery_delivered_at"),
)


def select_records() -> Select[Any]:
    """Jobs with the delivery of their end's callback (a final job with a callback has one such row in the
    outbox, beside the delivery of its ``started`` event)."""
    return select(*RECORD_COLUMNS, *DELIVERY_COLUMNS).select_from(
        jobs.outerjoin(
            callbacks, and_(callbacks.c.job_id == jobs.c.id, callbacks.c.event != CallbackEvent.STARTED.value)
        )
    )


def callback_state(m: Any) -> CallbackState | None:
    """A row's callback; rows read without the outbox (a new job's) show it waiting for the job to end."""
    url = m.get("callback_url")
    if url is None:
        return None
    if m.get("delivery_id") is None:
        return CallbackState(url=url, status=DeliveryStatus.PENDING)
    return CallbackState(
        url=url,
        status=DeliveryStatus(m["delivery_status"]),
        delivery_id=m["delivery_id"],
        attempts=m["delivery_attempts"],
        last_error=m["delivery_last_error"],
        delivered_at=m["delivery_delivered_at"],
    )


def job_record(row: Row[Any] | Any) -> JobRecord:
    m = row._mapping
    return JobRecord(
        id=m["id"],
        seq=m["seq"],
        status=Status(m["status"]),
        phase=Phase(m["phase"]),
        target=m["target"],
        target_key=m["target_key"],
        dry_run=bool(m["dry_run"]),
        submitted_at=m["submitted_at"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        attempts=m["attempts"],
        table_version=m["table_version"],
        result=m["result"],
        metrics=m["metrics"],
        error=m["error"],
        cancel_requested=bool(m["cancel_requested"]),
        engine=m["engine"],
        callback=callback_state(m),
        timings=None if m["timings"] is None else in_order(m["timings"]),
    )


class JobStore:
    """The connection to the job database that submissions, queries, claims and leases share."""

    def __init__(self, engine: Engine, *, lease_seconds: float = 30.0, clock: Clock = utcnow) -> None:
        self.engine = engine
        self.lease = timedelta(seconds=lease_seconds)
        self.clock = clock
        self._sqlite = is_sqlite(engine)
        self._writer_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Self:
        return cls(create_db_engine(url), **kwargs)

    def dispose(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _writer_turn(self) -> Iterator[None]:
        """SQLite allows one writer at a time. Threads of this process wait for their turn here, woken the moment
        the previous writer commits, instead of in SQLite's busy handler, which sleeps 1, 2, 5, 10... ms between
        tries; the busy handler is left to arbitrate between processes."""
        if not self._writer_lock.acquire(timeout=SQLITE_BUSY_TIMEOUT_MS / 1000):
            raise DatabaseUnavailableError("The job database did not answer: no write turn within the timeout")
        try:
            yield
        finally:
            self._writer_lock.release()

    @contextmanager
    def _tx(self, *, write: bool, single_read: bool = False) -> Iterator[Connection]:
        """A transaction. ``single_read``: the caller runs one SELECT, which sees one snapshot by itself, so on
        PostgreSQL it runs in autocommit mode, without the round trips of BEGIN and COMMIT."""
        sqlite_writer = write and self._sqlite
        try:
            with self._writer_turn() if sqlite_writer else nullcontext(), self.engine.connect() as conn:
                if sqlite_writer:
                    conn.execution_options(sqlite_immediate=True)
                if single_read and not write and not self._sqlite:
                    yield conn.execution_options(isolation_level="AUTOCOMMIT")
                    return
                with conn.begin():
                    yield conn
        except (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError) as exc:
            raise DatabaseUnavailableError(f"The job database did not answer: {exc.__class__.__name__}") from exc
        except sa_exc.DBAPIError as exc:
            if exc.connection_invalidated:
                raise DatabaseUnavailableError("The job database connection was lost.") from exc
            raise

    def migrate(self) -> None:
        try:
            migrate.upgrade(self.engine)
        except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
            raise DatabaseUnavailableError(f"The job database did not answer: {exc}") from exc

    def ping(self) -> None:
        with self._tx(write=False) as conn:
            conn.execute(select(1)).scalar_one()

    def schema_at_head(self) -> bool:
        try:
            return migrate.at_head(self.engine)
        except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
            raise DatabaseUnavailableError(f"The job database did not answer: {exc}") from exc
