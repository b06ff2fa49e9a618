"""Which job a worker may start next, and taking it under a fresh lease.

Claiming follows one rule, per normalised target: a job may start only when no job of its table is running and
no older job of its table is still queued, so a table's merges run one at a time in submission order. ``seq``
defines that order.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, bindparam, exists, func, select, update
from sqlalchemy import exc as sa_exc

from service.callback_outbox import enqueue_delivery
from service.jobs import CallbackEvent, ClaimedJob, Lease, Phase, Status
from service.models import jobs
from service.store import JobStore


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
            jobs.c.callback_url,
            jobs.c.commit_started,
        )
    )


_CANDIDATE_FROM, _CANDIDATE = _claim_candidate()
CLAIM_NEXT = _claim(jobs.c.seq == _CANDIDATE.scalar_subquery())
"""SQLite: pick and claim in one statement (BEGIN IMMEDIATE already excludes other claimers)."""
CLAIM_CANDIDATE_LOCKED = _CANDIDATE.with_for_update(skip_locked=True, of=_CANDIDATE_FROM)
"""PostgreSQL: lock the candidate row, skipping rows other claimers hold, then claim it by seq."""
CLAIM_SEQ = _claim(and_(jobs.c.seq == bindparam("claim_seq"), jobs.c.status == Status.QUEUED.value))


class JobClaims(JobStore):
    """The worker's claim on the next job."""

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
                if row is None:
                    return None
                # The job's first attempt starts: its started callback is promised in the same transaction, and
                # later attempts (retries) promise none.
                started_event = row.callback_url is not None and row.attempts == 1
                if started_event:
                    enqueue_delivery(conn, row.id, now, CallbackEvent.STARTED)
        except sa_exc.IntegrityError:
            # The unique index on running jobs per target refused a second running job: someone else won.
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
            started_event=started_event,
            commit_started=bool(row.commit_started),
        )
