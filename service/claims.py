"""Which job a worker may start next, and taking it under a fresh lease.

Claiming follows one rule, per normalised target: a job may start only when no job of its table is running and
no older job of its table is still queued, so a table's merges run one at a time in submission order. ``seq``
defines that order. A second rule, per Spark server, when the worker's ``SparkShare`` bounds it: a job may start
only while fewer than ``merges_at_once`` merges that started on the same server within ``long_merge_seconds`` run
there (docs/engine.md, "Merges at once on a Spark server").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, bindparam, exists, func, select, update
from sqlalchemy import exc as sa_exc

from service.callback_outbox import enqueue_delivery
from service.jobs import CallbackEvent, ClaimedJob, Lease, Phase, Status
from service.models import jobs
from service.store import JobStore


@dataclass(frozen=True)
class SparkShare:
    """How a worker shares its Spark server with the other workers on it."""

    server: str
    """The server's identity: its ``sc://host:port``, or the process for an embedded one."""
    merges_at_once: int | None
    """At most this many merges that started within ``long_merge_seconds`` run on the server; None: no bound."""
    long_merge_seconds: float = 3.0
    """A merge running longer no longer counts: a large merge runs beside the next ones instead of holding them."""

    def lock_key(self) -> int:
        """The PostgreSQL advisory lock that serialises the claims of the server's workers (a signed 64-bit key)."""
        digest = hashlib.blake2b(f"merge-service spark {self.server}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big", signed=True)


def _claim_candidate(*, bounded: bool) -> Any:
    """The oldest queued job that may start: due, no job of its table running, no older one of its table queued;
    ``bounded``: and fewer than ``merges_at_once`` recent merges running on the worker's Spark server."""
    j, running, older, shared = jobs.alias("j"), jobs.alias("r"), jobs.alias("o"), jobs.alias("s")
    rules = [
        j.c.status == Status.QUEUED.value,
        j.c.next_run_at <= bindparam("now", type_=jobs.c.next_run_at.type),
        ~exists().where(running.c.target_key == j.c.target_key, running.c.status == Status.RUNNING.value),
        ~exists().where(
            older.c.target_key == j.c.target_key,
            older.c.status == Status.QUEUED.value,
            older.c.seq < j.c.seq,
        ),
    ]
    if bounded:
        recent = (
            select(func.count())
            .select_from(shared)
            .where(
                shared.c.status == Status.RUNNING.value,
                shared.c.spark_server == bindparam("spark_server"),
                shared.c.claimed_at > bindparam("long_before", type_=jobs.c.claimed_at.type),
            )
            .scalar_subquery()
        )
        rules.append(recent < bindparam("merges_at_once"))
    return j, select(j.c.seq).where(*rules).order_by(j.c.seq).limit(1)


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
            spark_server=bindparam("spark_server"),
            claimed_at=now,
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
        )
    )


_CANDIDATES = {bounded: _claim_candidate(bounded=bounded) for bounded in (False, True)}
CLAIM_NEXT = {
    bounded: _claim(jobs.c.seq == candidate.scalar_subquery()) for bounded, (_, candidate) in _CANDIDATES.items()
}
"""SQLite: pick and claim in one statement (BEGIN IMMEDIATE already excludes other claimers)."""
CLAIM_CANDIDATE_LOCKED = {
    bounded: candidate.with_for_update(skip_locked=True, of=table)
    for bounded, (table, candidate) in _CANDIDATES.items()
}
"""PostgreSQL: lock the candidate row, skipping rows other claimers hold, then claim it by seq."""
CLAIM_SEQ = _claim(and_(jobs.c.seq == bindparam("claim_seq"), jobs.c.status == Status.QUEUED.value))
SERVER_LOCK = select(func.pg_advisory_xact_lock(bindparam("lock_key")))
"""PostgreSQL: one claim at a time per Spark server while its merges are bounded, so that two claimers never both
see the last free place; released when the claim's transaction ends."""


class JobClaims(JobStore):
    """The worker's claim on the next job."""

    def claim(self, owner: str, spark: SparkShare | None = None) -> ClaimedJob | None:
        """Take the next job that may start, under a fresh lease; None when nothing may start now. ``spark``: the
        worker's Spark server and its bound on merges at once."""
        bounded = spark is not None and spark.merges_at_once is not None

        def parameters() -> dict[str, Any]:
            now = self.clock()
            params: dict[str, Any] = {"now": now, "expires": now + self.lease, "owner": owner}
            params["spark_server"] = spark.server if spark is not None else None
            if spark is not None and spark.merges_at_once is not None:
                params["merges_at_once"] = spark.merges_at_once
                params["long_before"] = now - timedelta(seconds=spark.long_merge_seconds)
            return params

        try:
            with self._tx(write=True) as conn:
                params = parameters()
                now = params["now"]
                if self._sqlite:
                    # BEGIN IMMEDIATE already holds the write lock: no other claimer can interleave.
                    row = conn.execute(CLAIM_NEXT[bounded], params).first()
                else:
                    if spark is not None and bounded:
                        conn.execute(SERVER_LOCK, {"lock_key": spark.lock_key()})
                        params = parameters()  # the claims that waited for the lock may have ended merges
                    seq = conn.execute(CLAIM_CANDIDATE_LOCKED[bounded], params).scalar_one_or_none()
                    if seq is None:
                        return None
                    # The job this one waited for may have finished after the clock was read above: read it
                    # again, so a job never starts before its predecessor on the same table finished.
                    params = parameters()
                    now = params["now"]
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
        )
