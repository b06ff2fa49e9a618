"""The job database's engines. SQLite: connections are reused, concurrent writers (threads of one process and a
second engine, as another process would have) all land, and no idle pooled connection pins a WAL read snapshot,
which an outside checkpoint would report as busy. PostgreSQL: pooled connections that went stale while idle are
replaced before use."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy import event, select

from service.db import PING_AFTER_IDLE_SECONDS, SQLITE_BUSY_TIMEOUT_MS, begin_immediate
from service.errors import LeaseLostError
from service.jobs import NewJob, Phase
from service.manager import JobManager
from service.models import jobs
from tests.service.conftest import PostgresServer

DONE = {"num_affected_rows": 1, "num_updated_rows": 1, "num_deleted_rows": 0, "num_inserted_rows": 0}


@pytest.fixture
def db_file(tmp_path: Path) -> Path:
    return tmp_path / "jobs.db"


@pytest.fixture
def pooled(db_file: Path) -> JobManager:
    manager = JobManager.from_url(f"sqlite:///{db_file}")
    manager.migrate()
    return manager


def new(target: str) -> NewJob:
    return NewJob(target=target, target_key=target, spec={"sql": f"MERGE INTO {target}"}, dry_run=False)


def checkpoint(db_file: Path) -> tuple[int, int, int]:
    """``PRAGMA wal_checkpoint(TRUNCATE)`` from an outside connection: (busy, log frames, checkpointed frames).
    It is busy while any other connection holds a read snapshot or the write lock."""
    outside = sqlite3.connect(db_file, isolation_level=None, timeout=5)
    try:
        busy, log, done = outside.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return int(busy), int(log), int(done)
    finally:
        outside.close()


def test_connections_are_reused(pooled: JobManager) -> None:
    opened: list[object] = []
    event.listen(pooled.engine, "connect", lambda conn, _record: opened.append(conn))
    job, _ = pooled.submit(new("/lake/a"))
    for _ in range(50):
        pooled.get(job.id)
        pooled.list_jobs(limit=5)
    pooled.submit(new("/lake/a"))
    assert len(opened) <= 1
    pooled.dispose()


def test_idle_pooled_connections_pin_no_read_snapshot(pooled: JobManager, db_file: Path) -> None:
    # Every kind of call the API and a worker make, each leaving its connection in the pool.
    first, _ = pooled.submit(new("/lake/a"))
    pooled.submit(new("/lake/b"))
    pooled.get(first.id)
    pooled.get_spec(first.id)
    pooled.list_jobs(limit=1)
    pooled.queue_stats()
    pooled.ping()
    assert pooled.schema_at_head()
    claimed = pooled.claim("w1")
    assert claimed is not None
    pooled.heartbeat(claimed.lease)
    pooled.succeed(claimed.lease, table_version=1, result=DONE, metrics={"numSourceRows": 1})
    with pytest.raises(LeaseLostError):
        pooled.heartbeat(claimed.lease)
    with pytest.raises(RuntimeError), pooled._tx(write=True) as conn:  # a transaction abandoned half-way
        conn.execute(select(jobs.c.id)).first()
        raise RuntimeError("abandoned")
    raw = pooled.engine.raw_connection()  # a driver-level transaction left open by whoever borrowed it
    cursor = raw.cursor()
    cursor.execute("BEGIN")
    cursor.execute("SELECT count(*) FROM merge_jobs").fetchone()
    cursor.close()
    raw.close()
    # Hold several connections at once so the pool keeps more than one idle afterwards.
    held = [pooled.engine.connect() for _ in range(3)]
    for conn in held:
        conn.execute(select(jobs.c.seq)).all()
        conn.close()
    assert pooled.engine.pool.checkedin() >= 3  # type: ignore[attr-defined]
    busy, log, done = checkpoint(db_file)
    assert busy == 0 and log == done
    # The pool still works after the outside checkpoint reset the WAL.
    assert pooled.get(first.id).id == first.id
    pooled.dispose()


def test_concurrent_writers_all_land(pooled: JobManager, db_file: Path) -> None:
    other = JobManager.from_url(f"sqlite:///{db_file}")  # a second engine, as another process would have
    errors: list[BaseException] = []
    submitted: list[tuple[str, int]] = []
    lock = threading.Lock()
    stop = threading.Event()
    finished: list[str] = []

    def submitter(manager: JobManager, name: str) -> None:
        try:
            for i in range(25):
                job, created = manager.submit(new(f"/lake/{name}-{i % 3}"))
                assert created
                manager.get(job.id)
                with lock:
                    submitted.append((job.id, job.seq))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def worker() -> None:
        try:
            while not stop.is_set() or other.queue_stats().depth:
                claimed = other.claim("w")
                if claimed is None:
                    time.sleep(0.005)
                    continue
                other.set_phase(claimed.lease, Phase.WRITING)
                other.succeed(claimed.lease, table_version=1, result=DONE, metrics={"numSourceRows": 1})
                finished.append(claimed.lease.job_id)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=submitter, args=(pooled if n % 2 else other, f"s{n}")) for n in range(8)]
    claimer = threading.Thread(target=worker)
    claimer.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    claimer.join(timeout=60)
    assert not errors, errors
    assert len(submitted) == 200 and len({seq for _, seq in submitted}) == 200
    assert sorted(finished) == sorted(job_id for job_id, _ in submitted)
    with pooled.engine.connect() as conn:
        rows = conn.execute(select(jobs.c.status)).scalars().all()
    assert rows.count("succeeded") == 200
    busy, log, done = checkpoint(db_file)
    assert busy == 0 and log == done
    other.dispose()
    pooled.dispose()


def test_begin_immediate_waits_for_the_write_lock_and_gives_up_at_its_timeout(db_file: Path) -> None:
    holder = sqlite3.connect(db_file, isolation_level=None, check_same_thread=False)
    waiter = sqlite3.connect(db_file, isolation_level=None, check_same_thread=False)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.05, lambda: holder.execute("COMMIT"))
    release.start()
    started = time.monotonic()
    begin_immediate(waiter)
    assert time.monotonic() - started >= 0.04
    waiter.execute("INSERT INTO t VALUES (1)")
    waiter.execute("COMMIT")
    release.join()
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        begin_immediate(waiter, timeout=0.05)
    assert not waiter.in_transaction
    assert waiter.execute("PRAGMA busy_timeout").fetchone()[0] == SQLITE_BUSY_TIMEOUT_MS
    holder.execute("COMMIT")
    holder.close()
    waiter.close()


@pytest.mark.postgres
def test_postgres_connections_idle_past_the_threshold_are_checked_before_use(
    postgres_server: PostgresServer,
) -> None:
    url = postgres_server.create_database()
    manager = JobManager.from_url(url)
    manager.migrate()
    job, _ = manager.submit(new("/lake/a"))
    assert manager.get(job.id).id == job.id  # a single read, in autocommit mode
    with manager.engine.connect() as conn:
        in_tx = conn.connection.dbapi_connection.info.transaction_status  # type: ignore[union-attr]
    assert in_tx == 0  # idle: nothing left open by the autocommit read
    # The server drops every connection of the pool (a restart, a failover, an idle timeout on the way).
    admin = sqlalchemy.create_engine(postgres_server.admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(
            sqlalchemy.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :db AND pid <> pg_backend_pid()"
            ),
            {"db": url.rsplit("/", 1)[1]},
        )
    admin.dispose()
    time.sleep(PING_AFTER_IDLE_SECONDS + 0.2)
    assert manager.get(job.id).id == job.id
    assert manager.submit(new("/lake/a"))[1]
    manager.dispose()
    postgres_server.drop_database(url)
