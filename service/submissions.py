"""How a job enters the queue and how a caller cancels it: the API's writes.

On PostgreSQL submissions to one table are serialised with an advisory lock, so ``seq`` order is also commit order
(a claimer never sees a newer job before an older one of the same table).
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import and_, bindparam, insert, text, update
from sqlalchemy import exc as sa_exc
from ulid import ULID

from service.callback_outbox import enqueue_delivery
from service.errors import IdempotencyConflictError, JobNotFoundError
from service.jobs import JobRecord, NewJob, Phase, Status
from service.models import jobs
from service.store import RECORD_COLUMNS, JobStore, job_record, select_records

# The API's hot statements, built once: SQLAlchemy then finds their compiled form by a cache key it computed once,
# instead of building the statement and its key anew on every request.
INSERT_JOB = insert(jobs).returning(*RECORD_COLUMNS)
SELECT_BY_IDEMPOTENCY_KEY = (
    select_records()
    .add_columns(jobs.c.request_hash)
    .where(jobs.c.idempotency_scope == bindparam("scope"), jobs.c.idempotency_key == bindparam("key"))
)


def _advisory_key(target_key: str) -> int:
    return int.from_bytes(hashlib.sha256(target_key.encode()).digest()[:8], "big", signed=True)


class JobSubmissions(JobStore):
    """Submission (with its Idempotency-Key) and cancellation."""

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
                        "callback_url": new.callback_url,
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
            return job_record(row), True
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
        return job_record(row)

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
            ended = conn.execute(
                update(jobs)
                .where(this_job, jobs.c.status == Status.QUEUED.value, ~jobs.c.commit_started)
                .values(
                    status=Status.CANCELLED.value,
                    phase=Phase.DONE.value,
                    finished_at=now,
                    error=problem,
                    updated_at=now,
                )
                .returning(jobs.c.callback_url)
            ).first()
            done = ended is not None
            if ended is not None and ended.callback_url is not None:
                enqueue_delivery(conn, job_id, now, Status.CANCELLED.value)
            if not done:
                conn.execute(
                    update(jobs)
                    .where(this_job, jobs.c.status.in_([Status.RUNNING.value, Status.QUEUED.value]))
                    .values(cancel_requested=True, updated_at=now)
                )
            row = conn.execute(select_records().where(this_job)).first()
        if row is None:
            raise JobNotFoundError(job_id)
        return job_record(row), bool(done)
