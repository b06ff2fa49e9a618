"""Database engines for the job table: SQLite (WAL, busy timeout, explicit BEGIN) or PostgreSQL via psycopg."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import QueuePool

SQLITE_BUSY_TIMEOUT_MS = 30_000
PING_AFTER_IDLE_SECONDS = 1.0
WRITE_LOCK_POLL_MIN = 0.0002
WRITE_LOCK_POLL_MAX = 0.002
SQLITE_POOL_SIZE = 8
"""Connections kept open per process. Each one holds no transaction while idle (see ``_on_checkin``)."""
SQLITE_POOL_OVERFLOW = 32
"""Extra connections for bursts, closed again when returned; with the pool, more than the API's thread pool."""


def normalise_url(url: str | URL) -> URL:
    """``postgresql://`` means psycopg 3 here (SQLAlchemy would otherwise pick psycopg2)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def create_db_engine(url: str | URL) -> Engine:
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed)
    engine = create_engine(
        parsed,
        pool_size=10,
        max_overflow=10,
        pool_timeout=5,
        connect_args={"connect_timeout": 5},
    )
    _ping_when_idle(engine)
    return engine


def _ping_when_idle(engine: Engine, idle_seconds: float = PING_AFTER_IDLE_SECONDS) -> None:
    """Pessimistic disconnect handling, like ``pool_pre_ping`` but only for a connection that sat idle in the pool
    for ``idle_seconds``: a busy API would otherwise pay one more round trip on every request for connections it
    used a moment ago. A connection that fails its ping is replaced before it is handed out."""

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["returned_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        returned_at = record.info.get("returned_at")
        if returned_at is None or time.monotonic() - returned_at < idle_seconds:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)  # the check pool_pre_ping runs
            dbapi_connection.rollback()
        except Exception as exc:
            raise sa_exc.DisconnectionError("the pooled connection did not answer its ping") from exc


def _sqlite_engine(url: URL) -> Engine:
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        # A real pool: opening a connection costs its pragmas, and closing the last one to the file makes SQLite
        # checkpoint and remove the WAL (fsyncs on every request). Idle pooled connections are safe in WAL mode
        # as long as none keeps a transaction, and so a read snapshot, open: the pool rolls back on return.
        poolclass=QueuePool,
        pool_size=SQLITE_POOL_SIZE,
        max_overflow=SQLITE_POOL_OVERFLOW,
        pool_timeout=SQLITE_BUSY_TIMEOUT_MS / 1000,
        pool_reset_on_return="rollback",
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's own transaction handling would defer BEGIN and cannot do BEGIN IMMEDIATE: take it over.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "checkin")
    def _on_checkin(dbapi_connection: Any, _record: Any) -> None:
        # The pool's reset already rolled back; this makes "no open transaction while idle" hold even when a
        # reset was skipped (a connection invalidated half-way is closed rather than returned).
        if dbapi_connection is not None and dbapi_connection.in_transaction:
            dbapi_connection.rollback()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the lock up front: a deferred transaction that reads and then writes can fail with
        # SQLITE_BUSY without waiting, whereas BEGIN IMMEDIATE waits for the busy timeout.
        if conn.get_execution_options().get("sqlite_immediate", False):
            try:
                begin_immediate(conn.connection.dbapi_connection)
            except sqlite3.Error as exc:  # raised from an event, so SQLAlchemy would not wrap it
                raise sa_exc.OperationalError("BEGIN IMMEDIATE", None, exc) from exc
        else:
            conn.exec_driver_sql("BEGIN")

    return engine


def begin_immediate(dbapi_connection: Any, timeout: float = SQLITE_BUSY_TIMEOUT_MS / 1000) -> None:
    """``BEGIN IMMEDIATE``, waiting for the write lock in steps of at most ``WRITE_LOCK_POLL_MAX`` seconds.

    SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20, 25... ms between tries, so a writer that finds the lock
    taken for a moment (another process's short transaction) often waits ten times longer than the lock was held.
    """
    deadline = time.monotonic() + timeout
    delay = WRITE_LOCK_POLL_MIN
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA busy_timeout=0")
        try:
            while True:
                try:
                    cursor.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    busy = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY
                    if not busy or time.monotonic() >= deadline:
                        raise
                time.sleep(delay)
                delay = min(delay * 2, WRITE_LOCK_POLL_MAX)
        finally:
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    finally:
        cursor.close()
