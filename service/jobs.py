"""The job's life cycle (statuses, phases, the moves between them) and the records the store hands out."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from service.errors import InvalidTransitionError


class Status(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Phase(StrEnum):
    QUEUED = "queued"
    PREPARING_SOURCE = "preparing_source"
    FINDING_TOUCHED_FILES = "finding_touched_files"
    WRITING = "writing"
    COMMITTING = "committing"
    DONE = "done"


TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED})
ENGINE_PHASES = frozenset({Phase.PREPARING_SOURCE, Phase.FINDING_TOUCHED_FILES, Phase.WRITING, Phase.COMMITTING})

TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.QUEUED: frozenset({Status.RUNNING, Status.CANCELLED}),
    # running -> queued: a retry after a transient failure, or a lease taken back from a silent worker.
    Status.RUNNING: frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.QUEUED}),
    Status.SUCCEEDED: frozenset(),
    Status.FAILED: frozenset(),
    Status.CANCELLED: frozenset(),
}


def sources_for(target: Status) -> tuple[str, ...]:
    """The statuses a job may move to ``target`` from: used in the WHERE clause so the move is atomic."""
    return tuple(s.value for s, nexts in TRANSITIONS.items() if target in nexts)


def check_transition(current: Status | str, target: Status | str) -> None:
    current, target = Status(current), Status(target)
    if target not in TRANSITIONS[current]:
        raise InvalidTransitionError(f"A {current.value} job cannot become {target.value}.")


class DeliveryStatus(StrEnum):
    """A completion callback's state: ``pending`` until delivered or given up on."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class CallbackEvent(StrEnum):
    """What a callback tells: the job's first attempt started, or the job ended with this status. Each event of a
    job is its own delivery; one job has at most one of each."""

    STARTED = "started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class CallbackState:
    """A job's completion callback as the API shows it: the delivery of its end event, so ``delivery_id`` is None
    until the job is final (the ``started`` event's delivery is not shown)."""

    url: str
    status: DeliveryStatus
    delivery_id: str | None = None
    attempts: int = 0
    last_error: str | None = None
    delivered_at: datetime | None = None


@dataclass(frozen=True)
class JobRecord:
    """A job as the API shows it (the spec itself is not loaded for listings)."""

    id: str
    seq: int
    status: Status
    phase: Phase
    target: str
    target_key: str
    dry_run: bool
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int
    table_version: int | None
    result: dict[str, int] | None
    metrics: dict[str, int] | None
    error: dict[str, Any] | None
    cancel_requested: bool
    engine: str = "builtin"
    callback: CallbackState | None = None
    timings: dict[str, int] | None = None
    """Where a finished job's time went (``service.timeline``); None before it ends."""

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class Lease:
    """A worker's claim on one attempt of a job. ``attempt`` is the fencing token: every write names it."""

    job_id: str
    owner: str
    attempt: int


@dataclass(frozen=True)
class ClaimedJob:
    lease: Lease
    seq: int
    target: str
    target_key: str
    spec: dict[str, Any]
    dry_run: bool
    submitted_at: datetime
    started_at: datetime
    started_event: bool = False
    """This claim promised the job's ``started`` callback (its first attempt, with a callback URL)."""
    commit_started: bool = False
    """An earlier attempt began its commit: only then may the table already hold the job's ``txn``."""


@dataclass(frozen=True)
class NewJob:
    """What the API hands the store at submission: already validated and normalised."""

    target: str
    target_key: str
    spec: dict[str, Any]
    """The request body as submitted, in JSON, and not the engine's spec built from it: the job row is the source
    of truth between the process that accepted the job and the one that runs it, which may run another version of
    the service (during a rolling upgrade, or after a retry lands on a newer worker). Each process builds and
    checks the engine's spec from this body with its own code and its own lake roots."""
    dry_run: bool
    idempotency_key: str | None = None
    request_hash: str | None = None
    idempotency_scope: str = ""
    """Who the key belongs to: the fingerprint of the caller's token ("" without tokens)."""
    engine: str = "builtin"
    callback_url: str | None = None


@dataclass(frozen=True)
class QueueStats:
    depth: int
    oldest_age_seconds: float
    running: int
