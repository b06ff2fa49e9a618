"""The outbox of completion callbacks: a delivery row is written by the same transaction that starts a job's first
attempt or makes it final (``enqueue_delivery``), so the event and the promise to tell its callback commit
together or not at all. Each event is its own row, delivered at least once and independently of the others: a
job's ``started`` may reach its receiver after its end when the first attempt at ``started`` failed.
Workers claim due deliveries under a lease, and every write about an attempt is fenced by its lease owner and
attempt number, as a job's are: a sender that lost its lease records nothing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, bindparam, insert, or_, select, update
from ulid import ULID

from service.jobs import CallbackEvent, DeliveryStatus, JobRecord
from service.models import callbacks, jobs
from service.store import JobStore, job_record, select_records

ENQUEUE = insert(callbacks)
_NOW = bindparam("now", type_=callbacks.c.updated_at.type)
_DUE = and_(
    callbacks.c.status == DeliveryStatus.PENDING.value,
    callbacks.c.next_attempt_at <= _NOW,
    or_(callbacks.c.lease_expires_at.is_(None), callbacks.c.lease_expires_at < _NOW),
)
ANY_DUE = select(callbacks.c.id).where(_DUE).limit(1)
_FENCE = and_(
    callbacks.c.id == bindparam("delivery_id"),
    callbacks.c.status == DeliveryStatus.PENDING.value,
    callbacks.c.lease_owner == bindparam("owner"),
    callbacks.c.attempts == bindparam("attempt"),
)
_RECORD = update(callbacks).where(_FENCE)


def enqueue_delivery(conn: Connection, job_id: str, now: datetime, event: CallbackEvent | str) -> None:
    """Promise the callback of a job's event (it started, or it ended with this status) inside the transaction
    that made it happen."""
    conn.execute(
        ENQUEUE,
        {
            "id": str(ULID.from_datetime(now)),
            "job_id": job_id,
            "event": CallbackEvent(event).value,
            "status": DeliveryStatus.PENDING.value,
            "attempts": 0,
            "next_attempt_at": now,
            "created_at": now,
            "updated_at": now,
        },
    )


@dataclass(frozen=True)
class ClaimedDelivery:
    """One attempt at a delivery, held under a lease; ``attempt`` fences every write about it."""

    id: str
    owner: str
    attempt: int
    created_at: datetime
    """When the event happened: the delivery's age counts from here."""
    event: CallbackEvent
    job: JobRecord
    scope: str
    """Whose job it is (the submitting token's fingerprint): its token's secret signs the callback."""


def _due_ids(limit: int) -> Any:
    """PostgreSQL: lock up to ``limit`` due rows, skipping those other senders hold. A statement of its own: as a
    subquery of the UPDATE, the planner may run it again per row and claim more than ``limit`` rows."""
    return (
        select(callbacks.c.id)
        .where(_DUE)
        .order_by(callbacks.c.next_attempt_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )


def _claim_statement(where: Any) -> Any:
    return (
        update(callbacks)
        .where(where, _DUE)
        .values(
            lease_owner=bindparam("owner"),
            lease_expires_at=bindparam("expires", type_=callbacks.c.lease_expires_at.type),
            attempts=callbacks.c.attempts + 1,
            updated_at=_NOW,
        )
        .returning(callbacks.c.id, callbacks.c.job_id, callbacks.c.event, callbacks.c.attempts, callbacks.c.created_at)
    )


class CallbackOutbox(JobStore):
    """Claiming due callback deliveries and recording how each attempt went."""

    def deliveries_due(self) -> bool:
        """A read before the claim's write: on SQLite an idle poll then takes no write lock."""
        with self._tx(write=False, single_read=True) as conn:
            return conn.execute(ANY_DUE, {"now": self.clock()}).first() is not None

    def claim_deliveries(self, owner: str, *, lease_seconds: float, limit: int = 1) -> list[ClaimedDelivery]:
        """Take up to ``limit`` due deliveries under a lease; a delivery whose sender died is due again once its
        lease expires, and its next attempt carries the same delivery id."""
        with self._tx(write=True) as conn:
            now = self.clock()
            params = {"now": now, "owner": owner, "expires": now + timedelta(seconds=lease_seconds)}
            if self._sqlite:  # BEGIN IMMEDIATE already excludes other senders
                due = select(callbacks.c.id).where(_DUE).order_by(callbacks.c.next_attempt_at).limit(limit)
                rows = conn.execute(_claim_statement(callbacks.c.id.in_(due)), params).all()
            else:
                ids = conn.execute(_due_ids(limit), params).scalars().all()
                if not ids:
                    return []
                rows = conn.execute(_claim_statement(callbacks.c.id.in_(ids)), params).all()
            if not rows:
                return []
            records = conn.execute(
                select_records().add_columns(jobs.c.idempotency_scope).where(jobs.c.id.in_([r.job_id for r in rows]))
            ).all()
        by_job = {r.id: r for r in records}
        return [
            ClaimedDelivery(
                id=r.id,
                owner=owner,
                attempt=r.attempts,
                created_at=r.created_at,
                event=CallbackEvent(r.event),
                job=job_record(by_job[r.job_id]),
                scope=by_job[r.job_id].idempotency_scope,
            )
            for r in rows
        ]

    def _record(self, claimed: ClaimedDelivery, **values: Any) -> bool:
        with self._tx(write=True) as conn:
            now = self.clock()
            done = conn.execute(
                _RECORD.values(lease_owner=None, lease_expires_at=None, updated_at=now, **values),
                {"delivery_id": claimed.id, "owner": claimed.owner, "attempt": claimed.attempt},
            ).rowcount
        return bool(done)

    def record_delivered(self, claimed: ClaimedDelivery, *, key_id: str | None = None) -> bool:
        """Answers False when the attempt's lease was lost (another attempt may deliver again: at least once).
        ``key_id`` names the key that signed the attempt (never the key itself)."""
        return self._record(
            claimed,
            status=DeliveryStatus.DELIVERED.value,
            delivered_at=self.clock(),
            last_error=None,
            key_id=key_id,
        )

    def record_retry(
        self, claimed: ClaimedDelivery, *, error: str, next_attempt_at: datetime, key_id: str | None = None
    ) -> bool:
        return self._record(claimed, last_error=error, next_attempt_at=next_attempt_at, key_id=key_id)

    def record_failed(self, claimed: ClaimedDelivery, *, error: str, key_id: str | None = None) -> bool:
        return self._record(claimed, status=DeliveryStatus.FAILED.value, last_error=error, key_id=key_id)
