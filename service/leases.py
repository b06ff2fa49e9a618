"""A worker's lease on a running attempt, and every state change fenced by it: heartbeats, phases, the
attempt's outcome, and taking back jobs whose worker went silent. A write whose lease was lost changes nothing and
raises ``LeaseLostError``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, select, update

from service.callback_outbox import enqueue_delivery
from service.errors import LeaseLostError
from service.jobs import ENGINE_PHASES, Lease, Phase, Status, sources_for
from service.models import jobs
from service.store import JobStore
from service.timeline import close

Marks = Sequence[tuple[str, datetime]]
"""An attempt's timeline marks (``service.timeline.Timeline.marks``)."""

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


def _lease_params(lease: Lease) -> dict[str, Any]:
    return {"job_id": lease.job_id, "attempt": lease.attempt, "owner": lease.owner}


class JobLeases(JobStore):
    """The worker's fenced writes."""

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

    def _finish(self, lease: Lease, status: Status, timeline: Marks | None = None, **values: Any) -> None:
        """``timeline``: the attempt's marks, its last segment closed at ``finished_at``."""
        if Status.RUNNING.value not in sources_for(status):
            raise ValueError(f"a running job cannot become {status}")
        now_param = bindparam("now", type_=jobs.c.updated_at.type)
        if timeline is not None:
            values["timings"] = bindparam("timings", type_=jobs.c.timings.type)
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
            .returning(jobs.c.callback_url)
        )
        with self._tx(write=True) as conn:
            now = self.clock()
            params: dict[str, Any] = {"now": now}
            if timeline is not None:
                params["timings"] = close(list(timeline), now)
            done = conn.execute(statement, params).first()
            if done is not None and done.callback_url is not None:
                enqueue_delivery(conn, lease.job_id, now, status.value)
        if done is None:
            raise LeaseLostError(f"Job {lease.job_id} attempt {lease.attempt} is no longer held by {lease.owner}.")

    def succeed(
        self,
        lease: Lease,
        *,
        table_version: int | None,
        result: dict[str, int],
        metrics: dict[str, int],
        timeline: Marks | None = None,
    ) -> None:
        self._finish(
            lease,
            Status.SUCCEEDED,
            timeline,
            table_version=table_version,
            result=result,
            metrics=metrics,
            error=None,
        )

    def fail(
        self,
        lease: Lease,
        *,
        error: dict[str, Any],
        metrics: dict[str, int] | None = None,
        timeline: Marks | None = None,
    ) -> None:
        self._finish(lease, Status.FAILED, timeline, error=error, metrics=metrics)

    def cancel_running(self, lease: Lease, *, error: dict[str, Any], timeline: Marks | None = None) -> None:
        self._finish(lease, Status.CANCELLED, timeline, error=error)

    def retry(
        self,
        lease: Lease,
        *,
        error: dict[str, Any],
        delay_seconds: float,
        cancel_error: dict[str, Any],
        awaits_spark: bool | None = None,
    ) -> Status:
        """Back to the queue after a transient failure, with ``error``; or cancelled, with ``cancel_error``, if that
        was asked for meanwhile and no commit began. ``awaits_spark``: whether the attempt left an AUTO CDC batch
        half applied with Spark away, so losing the next attempt's worker spends none of the job's attempts; None
        (an attempt interrupted before it could tell) keeps what the attempt before it found."""
        with self._tx(write=True) as conn:
            now = self.clock()
            row = conn.execute(
                select(jobs.c.cancel_requested, jobs.c.commit_started, jobs.c.callback_url).where(self._fenced(lease))
            ).first()
            if row is None:
                raise LeaseLostError(f"Job {lease.job_id} attempt {lease.attempt} is no longer held.")
            if row.cancel_requested and not row.commit_started:
                values: dict[str, Any] = {
                    "status": Status.CANCELLED.value,
                    "phase": Phase.DONE.value,
                    "finished_at": now,
                    "error": cancel_error,
                }
            else:
                values = {
                    "status": Status.QUEUED.value,
                    "phase": Phase.QUEUED.value,
                    "next_run_at": now + timedelta(seconds=delay_seconds),
                    "error": error,
                }
                if awaits_spark is not None:
                    values["awaits_spark"] = awaits_spark
            conn.execute(
                update(jobs)
                .where(self._fenced(lease))
                .values(lease_owner=None, lease_expires_at=None, updated_at=now, **values)
            )
            if values["status"] == Status.CANCELLED.value and row.callback_url is not None:
                enqueue_delivery(conn, lease.job_id, now, Status.CANCELLED.value)
        return Status(values["status"])

    def reclaim_expired(
        self, *, max_attempts: int, lost_problem: Callable[[int], dict[str, Any]], cancel_error: dict[str, Any]
    ) -> list[str]:
        """Take back running jobs whose worker stopped renewing its lease: queue them again, or end them when
        their attempts are spent (with ``lost_problem``) or their cancellation was asked for (with
        ``cancel_error``). Answers the ids taken back.

        A worker lost while ``committing`` may have landed its commit: such a job gets one attempt beyond the
        limit, which finds its ``txn`` in the table and records the success, so a failed job never hides a
        changed table. A job whose last attempt left an AUTO CDC batch half applied (``awaits_spark``) has no limit,
        as the worker gives it none."""
        taken: list[str] = []
        with self._tx(write=True) as conn:
            now = self.clock()
            stmt = select(
                jobs.c.id,
                jobs.c.attempts,
                jobs.c.cancel_requested,
                jobs.c.commit_started,
                jobs.c.phase,
                jobs.c.awaits_spark,
                jobs.c.callback_url,
            ).where(jobs.c.status == Status.RUNNING.value, jobs.c.lease_expires_at < now)
            if not self._sqlite:
                stmt = stmt.with_for_update(skip_locked=True)
            for row in conn.execute(stmt).all():
                problem = lost_problem(row.attempts)
                if row.cancel_requested and not row.commit_started:
                    problem = cancel_error
                    values: dict[str, Any] = {
                        "status": Status.CANCELLED.value,
                        "phase": Phase.DONE.value,
                        "finished_at": now,
                    }
                elif not row.awaits_spark and (
                    row.attempts > max_attempts
                    or (row.attempts == max_attempts and row.phase != Phase.COMMITTING.value)
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
                    if values["status"] != Status.QUEUED.value and row.callback_url is not None:
                        enqueue_delivery(conn, row.id, now, values["status"])
        return taken
