"""Jobs written straight into the job table, in any state, for the operations page's tests: as many as a test
needs (bulk inserts through SQLAlchemy core), with the columns the store's own writes would leave."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, insert, update
from ulid import ULID

from service.jobs import Phase, Status
from service.models import jobs


def now() -> datetime:
    """The current time, read when a test builds its rows: the page's windows end at the real current time, which
    a time fixed at import would fall behind in a long test run."""
    return datetime.now(UTC).replace(microsecond=0)


def fingerprint(token: str) -> str:
    """The scope of a token's jobs, as ``service.deps`` computes it."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class JobRow:
    status: Status
    target_key: str
    owner: str = ""
    phase: Phase | None = None
    submitted_at: datetime = field(default_factory=lambda: now() - timedelta(minutes=10))
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: dict[str, Any] | None = None
    id: str = field(default_factory=lambda: str(ULID()))

    def values(self) -> dict[str, Any]:
        status = self.status
        started = self.started_at
        if started is None and status is not Status.QUEUED:
            started = self.submitted_at + timedelta(seconds=1)
        finished = self.finished_at
        if finished is None and status in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED):
            finished = (started or self.submitted_at) + timedelta(seconds=5)
        phase = self.phase or {
            Status.QUEUED: Phase.QUEUED,
            Status.RUNNING: Phase.PREPARING_SOURCE,
        }.get(status, Phase.DONE)
        return {
            "id": self.id,
            "status": status.value,
            "phase": phase.value,
            "target": self.target_key,
            "target_key": self.target_key,
            "spec": {"target": self.target_key},
            "dry_run": False,
            "engine": "builtin",
            "submitted_at": self.submitted_at,
            "started_at": started,
            "finished_at": finished,
            "attempts": 0 if status is Status.QUEUED else 1,
            "error": self.error,
            "idempotency_scope": self.owner,
            "cancel_requested": False,
            "commit_started": False,
            "next_run_at": self.submitted_at,
            "updated_at": finished or started or self.submitted_at,
        }


def insert_jobs(engine: Engine, rows: list[JobRow], *, chunk: int = 5000) -> None:
    with engine.begin() as conn:
        for i in range(0, len(rows), chunk):
            conn.execute(insert(jobs), [row.values() for row in rows[i : i + chunk]])


def set_phase(engine: Engine, job_id: str, phase: Phase) -> None:
    """What a worker's safe point writes, without a worker."""
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(phase=phase.value))


def failure(detail: str) -> dict[str, Any]:
    return {"type": "urn:merge-service:problem:schema-mismatch", "title": "Schema mismatch", "detail": detail}
