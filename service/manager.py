"""The job store: every database call of the service lives here.

Claiming follows one rule, per normalised target: a job may start only when no job of its table is running and
no older job of its table is still queued, so a table's merges run one at a time in submission order. ``seq``
defines that order; on PostgreSQL submissions to one table are serialised with an advisory lock so ``seq``
order is also commit order (a claimer never sees a newer job before an older one of the same table).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Row, and_, bindparam, exists, func, insert, or_, select, text, update
from sqlalchemy import exc as sa_exc
from ulid import ULID

from service import migrate
from service.db import SQLITE_BUSY_TIMEOUT_MS, create_db_engine, is_sqlite
from service.errors import (
    DatabaseUnavailableError,
    IdempotencyConflictError,
    InvalidCursorError,
    JobNotFoundError,
    LeaseLostError,
)
from service.jobs import (
    ENGINE_PHASES,
    ClaimedJob,
    JobRecord,
    Lease,
    NewJob,
    Phase,
    QueueStats,
    Status,
    sources_for,
)
from service.models import jobs

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
)

# The API's hot statements, built once: SQLAlchemy then finds their compiled form by a cache key it computed once,
# instead of building the statement and its key anew on every request.
INSERT_JOB = insert(jobs).returning(*RECORD_COLUMNS)
SELECT_JOB = select(*RECORD_COLUMNS).where(jobs.c.id == bindparam("job_id"))
# A job belongs to the caller whose token fingerprint scopes its Idempotency-Key: the token that submitted it.
SELECT_OWN_JOB = SELECT_JOB.where(jobs.c.idempotency_scope == bindparam("owner"))
SELECT_BY_IDEMPOTENCY_KEY = select(*RECORD_COLUMNS, jobs.c.request_hash).where(
    jobs.c.idempotency_scope == bindparam("scope"), jobs.c.idempotency_key == bindparam("key")
)

# The worker's statements, built once and outside its transactions: on SQLite every write transaction holds the
# database's single write lock, so nothing that can be done before BEGIN should be done after it.
_FENCE = and_(
    jobs.c.id == bindparam("job_id"),
    jobs.c.status == Status.RUNNING.value,
    jobs.c.attempts == bindparam("attempt"),
    jobs.c.lease_owner == bindparam("owner"),
)
RENEW_LEASE = (
    update(jobs)
    .where(_FENCE)
    .values(lease_expires_at=bindparam("expires"), updated_at=bindparam("now"))
    .returning(jobs.c.cancel_requested)
)
SET_PHASE = (
    update(jobs)
    .where(_FENCE)
    .values(phase=bindparam("new_phase"), lease_expires_at=bindparam("expires"), updated_at=bindparam("now"))
    .returning(jobs.c.cancel_requested)
)
SET_PHASE_WITHIN_LEASE = (  # entering ``committing``: only while the lease has not expired
    update(jobs)
    .where(_FENCE, jobs.c.lease_expires_at > bindparam("now"))
    .values(
        phase=bindparam("new_phase"),
        lease_expires_at=bindparam("expires"),
        updated_at=bindparam("now"),
        commit_started=True,
    )
    .returning(jobs.c.cancel_requested)
)


def _claim_candidate() -> Any:
    """The oldest queued job that may start: due, no job of its table running, no older one of its table queued."""
    j, running, older = jobs.alias("j"), jobs.alias("r"), jobs.alias("o")
    return j, (
        select(j.c.seq)
        .where(
            j.c.status == Status.QUEUED.value,
            j.c.next_run_at <= bindparam("now", type_=jobs.c.next_run_at.type),
            ~exists().where(running.c.target_key == j.c.target_key, running.c.status == Status.RUNNING.value),
            ~exists().where(
                older.c.target_key == j.c.target_key,
                older.c.status == Status.QUEUED.value,
                older.c.seq < j.c.seq,
            ),
        )
        .order_by(j.c.seq)
        .limit(1)
    )


def _claim(where: Any) -> Any:
    now = bindparam("now", type_=jobs.c.started_at.type)
    return (
        update(jobs)
        .where(where)
        .values(
            status=Status.RUNNING.value,
            # The attempt's first step: the engine reports it again once the table's snapshot is loaded.
            phase=Phase.PREPARING_SOURCE.value,
            attempts=jobs.c.attempts + 1,
            lease_owner=bindparam("owner"),
            lease_expires_at=bindparam("expires"),
            started_at=func.coalesce(jobs.c.started_at, now),
            updated_at=now,
        )
        .returning(
            jobs.c.id,
            jobs.c.seq,
            jobs.c.attempts,
            jobs.c.target,
            jobs.c.target_key,
            jobs.c.spec,
            jobs.c.dry_run,
            jobs.c.submitted_at,
            jobs.c.started_at,
        )
    )


_CANDIDATE_FROM, _CANDIDATE = _claim_candidate()
CLAIM_NEXT = _claim(jobs.c.seq == _CANDIDATE.scalar_subquery())
"""SQLite: pick and claim in one statement (BEGIN IMMEDIATE already excludes other claimers)."""
CLAIM_CANDIDATE_LOCKED = _CANDIDATE.with_for_update(skip_locked=True, of=_CANDIDATE_FROM)
"""PostgreSQL: lock the candidate row, skipping rows other claimers hold, then claim it by seq."""
CLAIM_SEQ = _claim(and_(jobs.c.seq == bindparam("claim_seq"), jobs.c.status == Status.QUEUED.value))


def _lease_params(lease: Lease) -> dict[str, Any]:
    return {"job_id": lease.job_id, "attempt": lease.attempt, "owner": lease.owner}


def _record(row: Row[Any] | Any) -> JobRecord:
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
    )


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


def _advisory_key(target_key: str) -> int:
    return int.from_bytes(hashlib.sha256(target_key.encode()).digest()[:8], "big", signed=True)


class JobManager:
    """Submission, claiming, leases and the fenced state changes of merge jobs."""

    def __init__(self, engine: Engine, *, lease_seconds: float = 30.0, clock: Clock = utcnow) -> None:
        self.engine = engine
        self.lease = timedelta(seconds=lease_seconds)
        self.clock = clock
        self._sqlite = is_sqlite(engine)
        self._writer_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> JobManager:
        return cls(create_db_engine(url), **kwargs)

    def dispose(self) -> None:
        self.engine.dispose()

    # --- plumbing ------------------------------------------------------------------------------------------

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

    # --- the API's calls -----------------------------------------------------------------------------------

    def submit(self, new: NewJob) -> tuple[JobRecord, bool]:
        """Store a queued job. Answers (job, created); an Idempotency-Key seen before answers the first job."""
        if new.idempotency_key is not None:
            found = self._by_idempotency_key(new)
            if found is not None:
                return found, False
        try:
            with self._tx(write=True) as conn:
                if not self._sqlite:
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _advisory_key(new.target_key)})
                now = self.clock()
                row = conn.execute(
                    INSERT_JOB,
                    {
                        "id": str(ULID.from_datetime(now)),
                        "status": Status.QUEUED.value,
                        "phase": Phase.QUEUED.value,
                        "target": new.target,
                        "target_key": new.target_key,
                        "spec": new.spec,
                        "dry_run": new.dry_run,
                        "engine": new.engine,
                        "submitted_at": now,
                        "attempts": 0,
                        "idempotency_key": new.idempotency_key,
                        "idempotency_scope": new.idempotency_scope,
                        "request_hash": new.request_hash,
                        "cancel_requested": False,
                        "next_run_at": now,
                        "updated_at": now,
                    },
                ).one()
            return _record(row), True
        except sa_exc.IntegrityError:
            # Two submissions with one Idempotency-Key raced; the other one won.
            if new.idempotency_key is None:
                raise
            found = self._by_idempotency_key(new)
            if found is None:
                raise
            return found, False

    def _by_idempotency_key(self, new: NewJob) -> JobRecord | None:
        with self._tx(write=False, single_read=True) as conn:
            row = conn.execute(
                SELECT_BY_IDEMPOTENCY_KEY, {"scope": new.idempotency_scope, "key": new.idempotency_key}
            ).first()
        if row is None:
            return None
        if row.request_hash != new.request_hash:
            raise IdempotencyConflictError(new.idempotency_key or "", row.id)
        return _record(row)

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
        return _record(row)

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
        stmt = select(*RECORD_COLUMNS)
        if owner is not None:
            stmt = stmt.where(jobs.c.idempotency_scope == owner)
        if status is not None:
            stmt = stmt.where(jobs.c.status == status.value)
        if target_key is not None:
            stmt = stmt.where(jobs.c.target_key == target_key)
        if cursor is not None:
            when, job_id = decode_cursor(cursor)
            stmt = stmt.where(or_(jobs.c.submitted_at < when, and_(jobs.c.submitted_at == when, jobs.c.id < job_id)))
        stmt = stmt.order_by(jobs.c.submitted_at.desc(), jobs.c.id.desc()).limit(limit + 1)
        with self._tx(write=False) as conn:
            rows = conn.execute(stmt).all()
        items = [_record(r) for r in rows[:limit]]
        next_cursor = None
        if len(rows) > limit and items:
            next_cursor = encode_cursor(items[-1].submitted_at, items[-1].id)
        return items, next_cursor

    def request_cancel(
        self, job_id: str, *, problem: dict[str, Any], owner: str | None = None
    ) -> tuple[JobRecord, bool]:
        """A queued job is cancelled at once; a running one is flagged for its worker's next safe point.
        Answers the job and whether this call ended it. With ``owner``, only that caller's job is touched."""
        this_job = jobs.c.id == job_id
        if owner is not None:
            this_job = and_(this_job, jobs.c.idempotency_scope == owner)
        with self._tx(write=True) as conn:
            now = self.clock()
            # A queued job whose earlier attempt began committing may already be in the table: its next attempt
            # looks for its txn first, and honours the cancel only if the commit did not land.
            done = conn.execute(
                update(jobs)
                .where(this_job, jobs.c.status == Status.QUEUED.value, ~jobs.c.commit_started)
                .values(
                    status=Status.CANCELLED.value,
                    phase=Phase.DONE.value,
                    finished_at=now,
                    error=problem,
                    updated_at=now,
                )
            ).rowcount
            if not done:
                conn.execute(
                    update(jobs)
                    .where(this_job, jobs.c.status.in_([Status.RUNNING.value, Status.QUEUED.value]))
                    .values(cancel_requested=True, updated_at=now)
                )
            row = conn.execute(select(*RECORD_COLUMNS).where(this_job)).first()
        if row is None:
            raise JobNotFoundError(job_id)
        return _record(row), bool(done)

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

    # --- the worker's calls --------------------------------------------------------------------------------

    def claim(self, owner: str) -> ClaimedJob | None:
        """Take the next job that may start, under a fresh lease; None when nothing may start now."""
        try:
            with self._tx(write=True) as conn:
                now = self.clock()
                params = {"now": now, "expires": now + self.lease, "owner": owner}
                if self._sqlite:
                    # BEGIN IMMEDIATE already holds the write lock: no other claimer can interleave.
                    row = conn.execute(CLAIM_NEXT, params).first()
                else:
                    seq = conn.execute(CLAIM_CANDIDATE_LOCKED, params).scalar_one_or_none()
                    if seq is None:
                        return None
                    # The job this one waited for may have finished after the clock was read above: read it
                    # again, so a job never starts before its predecessor on the same table finished.
                    now = self.clock()
                    params = {"now": now, "expires": now + self.lease, "owner": owner}
                    row = conn.execute(CLAIM_SEQ, {**params, "claim_seq": seq}).first()
        except sa_exc.IntegrityError:
            # The unique index on running jobs per target refused a second running job: someone else won.
            return None
        if row is None:
            return None
        return ClaimedJob(
            lease=Lease(job_id=row.id, owner=owner, attempt=row.attempts),
            seq=row.seq,
            target=row.target,
            target_key=row.target_key,
            spec=row.spec,
            dry_run=bool(row.dry_run),
            submitted_at=row.submitted_at,
            started_at=row.started_at,
        )

    def _fenced(self, lease: Lease) -> Any:
        return and_(
            jobs.c.id == lease.job_id,
            jobs.c.status == Status.RUNNING.value,
            jobs.c.attempts == lease.attempt,
            jobs.c.lease_owner == lease.owner,
        )

    def heartbeat(self, lease: Lease) -> bool:
        """Extend the lease; answers whether cancellation was requested. Raises LeaseLostError when fenced."""
        with self._tx(write=True) as conn:
            now = self.clock()
            row = conn.execute(RENEW_LEASE, {**_lease_params(lease), "now": now, "expires": now + self.lease}).first()
        if row is None:
            raise LeaseLostError(f"Job {lease.job_id} attempt {lease.attempt} is no longer held by {lease.owner}.")
        return bool(row.cancel_requested)

    def set_phase(self, lease: Lease, phase: Phase) -> bool:
        """Record the engine's progress; answers whether cancellation was requested.

        Entering ``committing`` also renews the lease, and only while it has not yet expired: past this point
        nobody else may take the job over before the commit has had a full lease to finish."""
        if phase not in ENGINE_PHASES:
            raise ValueError(f"{phase} is not a phase the engine reports")
        statement = SET_PHASE_WITHIN_LEASE if phase is Phase.COMMITTING else SET_PHASE
        with self._tx(write=True) as conn:
            now = self.clock()
            row = conn.execute(
                statement, {**_lease_params(lease), "now": now, "expires": now + self.lease, "new_phase": phase.value}
            ).first()
        if row is None:
            raise LeaseLostError(f"Job {lease.job_id} attempt {lease.attempt} is no longer held by {lease.owner}.")
        return bool(row.cancel_requested)

    def _finish(self, lease: Lease, status: Status, **values: Any) -> None:
        if Status.RUNNING.value not in sources_for(status):
            raise ValueError(f"a running job cannot become {status}")
        now_param = bindparam("now", type_=jobs.c.updated_at.type)
        statement = (  # built before the transaction: on SQLite, nobody else may write while it is open
            update(jobs)
            .where(self._fenced(lease))
            .values(
                status=status.value,
                phase=Phase.DONE.value,
                finished_at=now_param,
                lease_owner=None,
                lease_expires_at=None,
                updated_at=now_param,
                **values,
            )
        )
        with self._tx(write=True) as conn:
            done = conn.execute(statement, {"now": self.clock()}).rowcount
        if not done:
            raise LeaseLostError(f"Job {lease.job_id} attempt {lease.attempt} is no longer held by {lease.owner}.")

    def succeed(
        self, lease: Lease, *, table_version: int | None, result: dict[str, int], metrics: dict[str, int]
    ) -> None:
        self._finish(lease, Status.SUCCEEDED, table_version=table_version, result=result, metrics=metrics, error=None)

    def fail(self, lease: Lease, *, error: dict[str, Any], metrics: dict[str, int] | None = None) -> None:
        self._finish(lease, Status.FAILED, error=error, metrics=metrics)

    def cancel_running(self, lease: Lease, *, error: dict[str, Any]) -> None:
        self._finish(lease, Status.CANCELLED, error=error)

    def retry(self, lease: Lease, *, error: dict[str, Any], delay_seconds: float) -> Status:
        """Back to the queue after a transient failure (or cancelled, if that was asked for meanwhile)."""
        with self._tx(write=True) as conn:
            now = self.clock()
            row = conn.execute(
                select(jobs.c.cancel_requested, jobs.c.commit_started).where(self._fenced(lease))
            ).first()
            if row is None:
                raise LeaseLostError(f"Job {lease.job_id} attempt {lease.attempt} is no longer held.")
            if row.cancel_requested and not row.commit_started:
                values: dict[str, Any] = {
                    "status": Status.CANCELLED.value,
                    "phase": Phase.DONE.value,
                    "finished_at": now,
                }
            else:
                values = {
                    "status": Status.QUEUED.value,
                    "phase": Phase.QUEUED.value,
                    "next_run_at": now + timedelta(seconds=delay_seconds),
                }
            conn.execute(
                update(jobs)
                .where(self._fenced(lease))
                .values(error=error, lease_owner=None, lease_expires_at=None, updated_at=now, **values)
            )
        return Status(values["status"])

    def reclaim_expired(self, *, max_attempts: int, lost_problem: Callable[[int], dict[str, Any]]) -> list[str]:
        """Take back running jobs whose worker stopped renewing its lease: queue them again, or end them when
        their attempts are spent or their cancellation was asked for. Answers the ids taken back.

        A worker lost while ``committing`` may have landed its commit: such a job gets one attempt beyond the
        limit, which finds its ``txn`` in the table and records the success, so a failed job never hides a
        changed table."""
        taken: list[str] = []
        with self._tx(write=True) as conn:
            now = self.clock()
            stmt = select(
                jobs.c.id, jobs.c.attempts, jobs.c.cancel_requested, jobs.c.commit_started, jobs.c.phase
            ).where(jobs.c.status == Status.RUNNING.value, jobs.c.lease_expires_at < now)
            if not self._sqlite:
                stmt = stmt.with_for_update(skip_locked=True)
            for row in conn.execute(stmt).all():
                problem = lost_problem(row.attempts)
                if row.cancel_requested and not row.commit_started:
                    values: dict[str, Any] = {
                        "status": Status.CANCELLED.value,
                        "phase": Phase.DONE.value,
                        "finished_at": now,
                    }
                elif row.attempts > max_attempts or (
                    row.attempts == max_attempts and row.phase != Phase.COMMITTING.value
                ):
                    values = {"status": Status.FAILED.value, "phase": Phase.DONE.value, "finished_at": now}
                else:
                    values = {"status": Status.QUEUED.value, "phase": Phase.QUEUED.value, "next_run_at": now}
                done = conn.execute(
                    update(jobs)
                    .where(
                        jobs.c.id == row.id,
                        jobs.c.status == Status.RUNNING.value,
                        jobs.c.attempts == row.attempts,
                        jobs.c.lease_expires_at < now,
                    )
                    .values(error=problem, lease_owner=None, lease_expires_at=None, updated_at=now, **values)
                ).rowcount
                if done:
                    taken.append(row.id)
        return taken
